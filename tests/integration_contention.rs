//! Several `handoff run` processes on one consumer at once, round after round, while events are
//! written: every event is handed off exactly once, each loser exits with the conflict code and
//! says another run holds the consumer (stopped at its start, nothing committed) or the checkpoint
//! changed under it, and no run ends any other way.

use crate::support;

use std::process::Output;
use std::time::Duration;

use bson::doc;
use support::live::*;

const RUNNERS: usize = 4;
const ROUNDS: usize = 6;

#[test]
fn concurrent_runs_on_one_consumer_hand_off_every_event_exactly_once() {
    let live = Live::start();
    let start = live.start_consumer();
    // The writer keeps inserting while the rounds race.
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let writer = live.background(async move |_, db| {
        let orders = db.collection::<bson::Document>("orders");
        let mut written = 0;
        while stop_rx.try_recv().is_err() {
            orders
                .insert_many(
                    (0..5)
                        .map(|k| doc! {"_id": written + k})
                        .collect::<Vec<_>>(),
                )
                .await
                .unwrap();
            written += 5;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        written
    });

    let (mut wins, mut start_losses, mut losses, mut watermark_losses) = (0, 0, 0, 0);
    for round in 0..ROUNDS {
        // A run ends after 40 events: the writer never lets the stream idle for a second.
        let children: Vec<_> = (0..RUNNERS)
            .map(|_| live.spawn(&["--max-events", "40"]))
            .collect();
        let outputs: Vec<Output> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let mut round_wins = 0;
        for output in &outputs {
            let err = support::stderr(output);
            match output.status.code() {
                Some(0) => {
                    let out = support::outputs(output);
                    if out["events_handed_off"].as_u64().unwrap() > 0 {
                        let id = out["last_event_id"].as_str().unwrap().to_string();
                        assert!(
                            outbox_event_ids(&live.outbox()).contains(&id),
                            "a winner reported {id}, which the outbox does not hold"
                        );
                    }
                    round_wins += 1;
                }
                Some(3) => {
                    let out = support::fails(output, 3, "error[conflict]: ");
                    if err.contains("holds this consumer")
                        || err.contains("took this consumer's checkpoint while this one started")
                    {
                        // Stopped at its start by another run's lease: it committed nothing.
                        assert_eq!(out["events_handed_off"], 0, "{err}");
                        start_losses += 1;
                    } else if err.contains("Checkpoint changed during this run") {
                        losses += 1;
                    } else {
                        assert!(
                            err.contains("Checkpoint changed while saving the idle watermark"),
                            "{err}"
                        );
                        watermark_losses += 1;
                    }
                }
                other => panic!("round {round}: unexpected exit {other:?}: {err}"),
            }
        }
        // The last run to move the checkpoint cannot have lost: every round has a winner.
        assert!(round_wins >= 1, "round {round}: no run succeeded");
        wins += round_wins;
    }
    stop_tx.send(()).unwrap();
    let written = writer.join().unwrap();
    // Unhindered runs drain the rest.
    while support::ok(&live.run(&[]))["events_handed_off"] != 0 {}

    let stream = live.events_after(&start);
    assert_eq!(stream.len(), written as usize);
    let outbox = live.outbox();
    assert_eq!(
        outbox_event_ids(&outbox),
        stream.iter().map(event_id).collect::<Vec<_>>()
    );
    assert_checkpoint_at_end(&live, stream.last().unwrap().get_document("_id").unwrap());
    eprintln!(
        "{ROUNDS} rounds of {RUNNERS} runs: {wins} succeeded, {start_losses} stopped at their \
         start, {losses} lost a commit, {watermark_losses} lost the idle watermark; {written} \
         events handed off once each"
    );
    assert_eq!(
        wins + start_losses + losses + watermark_losses,
        ROUNDS * RUNNERS
    );
    assert!(
        start_losses + losses + watermark_losses >= 1,
        "the runs never actually raced"
    );
}
