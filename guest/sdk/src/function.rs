//! A policy that is one function: [`policy!`](crate::policy) turns a `decide` function into a
//! [`Policy`](crate::Policy) type and, in the component, exports it.

/// Declares the policy type `$name` whose decisions are the function `$decide` (a closure or a
/// function taking `(&mut Delivered<'_>, String)` and returning a [`Decision`](crate::Decision),
/// like [`Policy::decide`](crate::Policy::decide)), and exports it when built for WebAssembly
/// (as [`export_policy!`](crate::export_policy) does). The type has no parameters and the
/// defaults of everything else; implement [`Policy`](crate::Policy) for a policy that needs more.
///
/// The smallest policy, the default's behaviour:
///
/// ```
/// use handoff_policy_sdk::Decision;
///
/// handoff_policy_sdk::policy!(MyPolicy, |_event, id| Decision::HandOff(id));
/// ```
///
/// And one that decides, run natively against the fake host:
///
/// ```
/// use handoff_policy_sdk::fake::FakeHost;
/// use handoff_policy_sdk::{Decision, Settings, event_id, run};
///
/// handoff_policy_sdk::policy!(NoDeletes, |event, id| {
///     if event.operation_type == "delete" {
///         Decision::Skip("deletes are not published".into())
///     } else {
///         Decision::HandOff(id)
///     }
/// });
///
/// let mut host = FakeHost::new().event("A", "insert").event("B", "delete");
/// run::<NoDeletes>(&mut host, &Settings::new(50, 3000)).unwrap();
/// assert_eq!(host.handed_off(), vec![event_id("A")]);
/// assert_eq!(host.skipped(), vec!["deletes are not published"]);
/// ```
#[macro_export]
macro_rules! policy {
    ($name:ident, $decide:expr $(,)?) => {
        /// The policy: its decisions are the function given to `handoff_policy_sdk::policy!`.
        #[derive(Default)]
        pub struct $name;

        impl $crate::Policy for $name {
            fn decide(
                &mut self,
                event: &mut $crate::Delivered<'_>,
                id: ::std::string::String,
            ) -> $crate::Decision {
                let decide: fn(
                    &mut $crate::Delivered<'_>,
                    ::std::string::String,
                ) -> $crate::Decision = $decide;
                decide(event, id)
            }
        }

        #[cfg(target_arch = "wasm32")]
        $crate::export_policy!($name);
    };
}
