//! The `mongo-sim` command as the PyMongo suites start it: it says where it listens, and refuses a
//! malformed argument with a message that names it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn the_command_says_where_it_listens_and_answers_there() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mongo-sim"))
        .args([
            "--port",
            "0",
            "--replica-set-id",
            "6740a1b2c3d4e5f601234567",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("mongo-sim starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("a first line");
    let addr = line
        .trim()
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("{line:?}"));
    let addr: std::net::SocketAddr = addr.parse().expect("an address");
    assert_ne!(addr.port(), 0);
    let connected = std::net::TcpStream::connect(addr);
    let _ = child.kill();
    let _ = child.wait();
    assert!(connected.is_ok(), "{connected:?}");
}

#[test]
fn a_malformed_replica_set_id_is_refused_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_mongo-sim"))
        .args(["--port", "0", "--replica-set-id", "not-hex"])
        .output()
        .expect("mongo-sim runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--replica-set-id must be 24 hex digits"),
        "{err}"
    );
}
