//! `handoff man`: the manual pages, one per command.

/// The commands under `command` that have a manual page.
fn documented(command: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    command.get_subcommands().filter(|s| !s.is_hide_set())
}

/// `handoff man`: one command's page on stdout, or every page into `dir`.
pub fn run(path: &[String], dir: Option<&std::path::Path>) -> handoff::error::Result<()> {
    // `help` has no page of its own: it prints the others.
    fn without_help(command: clap::Command) -> clap::Command {
        command
            .disable_help_subcommand(true)
            .mut_subcommands(without_help)
    }
    let mut command =
        without_help(<super::Cli as clap::CommandFactory>::command().bin_name("handoff"));
    command.build();
    if let Some(dir) = dir {
        let failed = |e: std::io::Error| {
            handoff::error::HandoffError::BadInput(format!(
                "cannot write the manual pages into {}: {e}",
                dir.display()
            ))
        };
        std::fs::create_dir_all(dir).map_err(failed)?;
        let mut pages = vec![command];
        while let Some(page) = pages.pop() {
            pages.extend(documented(&page).cloned());
            clap_mangen::Man::new(page)
                .generate_to(dir)
                .map_err(failed)?;
        }
        return Ok(());
    }
    let mut page = &command;
    for name in path {
        page = match page.find_subcommand(name) {
            Some(sub) => sub,
            None => {
                let known: Vec<&str> = documented(page).map(clap::Command::get_name).collect();
                return Err(handoff::error::HandoffError::BadInput(format!(
                    "{} has no command {}: its commands are {}",
                    page.get_display_name().unwrap_or("handoff"),
                    handoff::domain::text::escape_name(name, 64),
                    known.join(", ")
                )));
            }
        };
    }
    let mut text = Vec::new();
    clap_mangen::Man::new(page.clone())
        .render(&mut text)
        .map_err(handoff::output::stdout_failed)?;
    handoff::output::write_stdout(&String::from_utf8_lossy(&text))
}
