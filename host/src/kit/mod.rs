//! The policy authors' kit: fixture-driven policy tests (`cases`), compatibility checks (`check`),
//! a policy crate scaffold (`scaffold`) and live-stream recording (`record`).

pub mod cases;
pub mod check;
pub mod record;
pub mod scaffold;
