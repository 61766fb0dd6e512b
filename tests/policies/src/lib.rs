//! Paths of the test policy components, built from `examples/` for wasm32-wasip2 by `build.rs`:
//! - `PREFIXED_IDS`: a well-behaved second policy (outbox IDs `<prefix>-<op>-<digest>`);
//! - `KEYED_IDS`: outbox IDs of the document key and cluster time, the same however an event
//!   was split;
//! - `SPIN_FOREVER`, `MEMORY_HOG`, `DEEP_RECURSION`, `TRAP`: policies the sandbox must stop;
//! - `FORGED_TOKEN`, `SKIP_AHEAD`, `FALSE_REPORT`, `HUGE_ID`, `MOVE_BACKWARDS`, `HOARD`: decisions
//!   the host must refuse;
//! - `READ_FILE`, `READ_ENV`: policies reaching for host files and environment, which the sandbox
//!   withholds;
//! - `SLEEP_FOREVER`, `POLL_FOREVER`: policies waiting in WASI for days, which the host must bound;
//! - `CLOCKS_AND_RANDOM`: outbox IDs made of WASI clock and random readings (replay determinism);
//! - `NET_CLIENT`: a component using sockets (TCP, UDP, name lookup), which the host links and denies;
//! - `FOREIGN_IMPORT`: a component importing an interface the contract lacks, under the contract's
//!   package name, which the host must refuse to load;
//! - `EFFECTS_NONSENSE`, `EFFECTS_FOREVER`, `EFFECTS_HOST_CALL`: a delivery's effects (contract
//!   1.6) answered with nonsense, never, or after calling the contract's host (which no run
//!   provides then): the host must deliver nothing;
//! - `SHAPED_PROJECTION`: the default's hand-off, and projection documents of its own shape (a
//!   delivery's effects, contract 1.6), which `deliver reconcile` compares through the policy;
//! - `SHAPED_NONSENSE`, `SHAPED_FOREVER`: the default's hand-off, and a projection's effects
//!   answered with nonsense or never: `deliver reconcile --repair` through them writes nothing.

include!(concat!(env!("OUT_DIR"), "/paths.rs"));
