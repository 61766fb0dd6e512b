//! The `failCommand` fail points: what is configured, and which commands they fire on.

use bson::Document;

use crate::error::CommandError;

/// `alwaysOn` is `{skip: 0, times: None}`; `{times: n}` and `{skip: n}` may be combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// Let this many matching commands through first.
    pub skip: u64,
    /// Then fire this many times (forever when `None`).
    pub times: Option<u64>,
}

/// One configured fail point: when it fires, on which commands, and what it does.
#[derive(Debug, Clone)]
pub struct FailCommand {
    pub mode: Mode,
    pub commands: Vec<String>,
    pub error_code: Option<i32>,
    pub error_labels: Option<Vec<String>>,
    pub close_connection: bool,
    pub block_ms: Option<u64>,
    pub write_concern_error: Option<Document>,
}

/// The fail points that can be configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailPointName {
    FailCommand,
    FailGetMoreAfterCursorCheckout,
}

/// What a fired fail point does to the command.
#[derive(Debug, Default)]
pub struct FailAction {
    pub block_ms: Option<u64>,
    pub close_connection: bool,
    pub error: Option<CommandError>,
    /// Run the command, then report this `writeConcernError`.
    pub write_concern_error: Option<Document>,
    /// The error arises inside the cursor (so change-stream resume labels apply), not in
    /// front of the command.
    pub in_cursor: bool,
}

/// The configured fail points.
#[derive(Debug, Default)]
pub struct FailPoints {
    fail_command: Option<FailCommand>,
    /// `failGetMoreAfterCursorCheckout`: fails getMore as if the cursor itself failed.
    fail_get_more: Option<FailCommand>,
    /// How many times `failCommand` has fired since configured.
    times_entered: u64,
}

impl FailPoints {
    /// Consumes one activation of a fail point that applies to `command`.
    pub fn check(&mut self, command: &str) -> Option<FailAction> {
        if let Some(action) = fire(&mut self.fail_command, command) {
            self.times_entered += 1;
            return Some(action);
        }
        let mut action = fire(&mut self.fail_get_more, command)?;
        action.in_cursor = true;
        self.times_entered += 1;
        Some(action)
    }

    /// How many times the fail points have fired since one was last configured.
    pub fn times_entered(&self) -> u64 {
        self.times_entered
    }

    /// Turns a fail point off; the count of firings is kept.
    pub fn disable(&mut self, name: FailPointName) {
        *self.slot(name) = None;
    }

    /// Sets a fail point and restarts the count of firings.
    pub fn arm(&mut self, name: FailPointName, fail: FailCommand) {
        *self.slot(name) = Some(fail);
        self.times_entered = 0;
    }

    fn slot(&mut self, name: FailPointName) -> &mut Option<FailCommand> {
        match name {
            FailPointName::FailCommand => &mut self.fail_command,
            FailPointName::FailGetMoreAfterCursorCheckout => &mut self.fail_get_more,
        }
    }
}

fn fire(slot: &mut Option<FailCommand>, command: &str) -> Option<FailAction> {
    let fp = slot.as_mut()?;
    if !fp.commands.iter().any(|c| c == command) {
        return None;
    }
    if fp.mode.skip > 0 {
        fp.mode.skip -= 1;
        return None;
    }
    if let Some(n) = &mut fp.mode.times {
        if *n == 0 {
            return None;
        }
        *n -= 1;
    }
    let action = FailAction {
        block_ms: fp.block_ms,
        close_connection: fp.close_connection,
        error: fp.error_code.map(|code| {
            let mut e = CommandError::new(
                code,
                format!("Failing command {command} via 'failCommand' failpoint"),
            );
            e.labels = fp.error_labels.clone();
            e
        }),
        write_concern_error: fp.write_concern_error.clone(),
        in_cursor: false,
    };
    if fp.mode.times == Some(0) {
        *slot = None;
    }
    Some(action)
}
