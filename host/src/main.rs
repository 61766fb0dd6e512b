fn main() -> std::process::ExitCode {
    handoff::cli::main()
}
