//! `configureFailPoint` with the `failCommand` fail point.

use bson::{Bson, Document, doc};
use tracing::info;

use super::Ctx;
use crate::error::{CmdResult, CommandError};
use crate::failpoints::{FailCommand, FailPointName, Mode};

fn parse_mode(v: Option<&Bson>) -> CmdResult<Option<Mode>> {
    let count = |v: &Bson| {
        crate::values::as_f64(v)
            .filter(|n| *n >= 0.0)
            .map(|n| n as u64)
    };
    match v {
        Some(Bson::String(s)) if s == "off" => Ok(None),
        Some(Bson::String(s)) if s == "alwaysOn" => Ok(Some(Mode {
            skip: 0,
            times: None,
        })),
        Some(Bson::Document(d)) => {
            let times = match d.get("times") {
                Some(t) => Some(count(t).ok_or_else(|| {
                    CommandError::bad_value("'times' must be a non-negative number")
                })?),
                None => None,
            };
            let skip = match d.get("skip") {
                Some(s) => count(s).ok_or_else(|| {
                    CommandError::bad_value("'skip' must be a non-negative number")
                })?,
                None => 0,
            };
            if let Some(p) = d.get("activationProbability") {
                let p = crate::values::as_f64(p).unwrap_or(0.0);
                return Ok((p > 0.0).then_some(Mode {
                    skip: 0,
                    times: None,
                }));
            }
            if times.is_none() && !d.contains_key("skip") {
                return Err(CommandError::bad_value(
                    "mode must be 'off', 'alwaysOn', {times: n} or {skip: n}",
                ));
            }
            Ok(if times == Some(0) {
                None
            } else {
                Some(Mode { skip, times })
            })
        }
        _ => Err(CommandError::bad_value("missing or invalid 'mode'")),
    }
}

pub fn configure(ctx: &Ctx<'_>) -> CmdResult<Document> {
    if ctx.db != "admin" {
        return Err(CommandError::new(
            13,
            "configureFailPoint may only be run against the admin database.",
        ));
    }
    let name = ctx.cmd.get_str("configureFailPoint").unwrap_or_default();
    let point = match name {
        "failCommand" => FailPointName::FailCommand,
        "failGetMoreAfterCursorCheckout" => FailPointName::FailGetMoreAfterCursorCheckout,
        _ => {
            return Err(CommandError::bad_value(format!(
                "Cannot find failpoint {name}"
            )));
        }
    };
    let mode = parse_mode(ctx.cmd.get("mode"))?;
    let mut fps = ctx.shared.failpoints_of(ctx.conn.listener.shard());
    let count = fps.times_entered();
    let Some(mode) = mode else {
        fps.disable(point);
        info!(fail_point = name, "fail point disabled");
        return Ok(doc! {"count": count as i64});
    };
    let data = match ctx.cmd.get("data") {
        Some(Bson::Document(d)) => d.clone(),
        _ => {
            return Err(CommandError::bad_value(
                "failCommand requires a 'data' document",
            ));
        }
    };
    let commands: Vec<String> = match data.get("failCommands") {
        _ if point == FailPointName::FailGetMoreAfterCursorCheckout => {
            vec!["getMore".to_string()]
        }
        Some(Bson::Array(a)) => a
            .iter()
            .filter_map(|b| match b {
                Bson::String(s) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        _ => {
            return Err(CommandError::bad_value(
                "'failCommands' must be an array of command names",
            ));
        }
    };
    let error_code = data
        .get("errorCode")
        .and_then(crate::values::as_f64)
        .map(|n| n as i32);
    let error_labels = match data.get("errorLabels") {
        Some(Bson::Array(a)) => Some(
            a.iter()
                .filter_map(|b| match b {
                    Bson::String(s) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
        ),
        _ => None,
    };
    let close_connection = matches!(data.get("closeConnection"), Some(Bson::Boolean(true)));
    let block = matches!(data.get("blockConnection"), Some(Bson::Boolean(true)));
    let block_ms = if block {
        Some(
            data.get("blockTimeMS")
                .and_then(crate::values::as_f64)
                .filter(|n| *n >= 0.0)
                .ok_or_else(|| CommandError::bad_value("blockConnection requires blockTimeMS"))?
                .min(3_600_000.0) as u64,
        )
    } else {
        None
    };
    let write_concern_error = match data.get("writeConcernError") {
        Some(Bson::Document(d)) => Some(d.clone()),
        Some(_) => {
            return Err(CommandError::bad_value(
                "writeConcernError must be an object",
            ));
        }
        None => None,
    };
    if error_code.is_none()
        && !close_connection
        && block_ms.is_none()
        && write_concern_error.is_none()
    {
        return Err(CommandError::bad_value(
            "failCommand needs errorCode, writeConcernError, closeConnection or blockConnection",
        ));
    }
    info!(fail_point = name, commands = ?commands, error_code, close_connection, block_ms, "fail point configured");
    fps.arm(
        point,
        FailCommand {
            mode,
            commands,
            error_code,
            error_labels,
            close_connection,
            block_ms,
            write_concern_error,
        },
    );
    Ok(doc! {"count": count as i64})
}
