//! Named points where a test can make the process die or dawdle, to reach states a SIGKILL
//! from outside hits only by luck (a commit applied in the coordinator, its parts not yet
//! active; a restart slow to resolve them).
//! `MERGESTREAM_FAILPOINTS=name[,name…]` in the environment arms them; unset, each check is
//! one load of a cached flag.

use std::sync::OnceLock;

/// After the coordinator took an insert's commit, before its parts are renamed into place.
pub const AFTER_COMMIT_BEFORE_ACTIVATION: &str = "after-commit-before-activation";

/// SYSTEM RESTORE REPLICA, right after it attached its first part back: a restore cut short.
pub const RESTORE_AFTER_FIRST_ATTACH: &str = "restore-after-first-attach";

/// The start of a storage node waits this long before resolving its prepared inserts, as
/// when the coordinator is slow to answer after a crash.
pub const SLOW_RECOVERY: &str = "slow-recovery";

fn armed() -> &'static [String] {
    static ARMED: OnceLock<Vec<String>> = OnceLock::new();
    ARMED.get_or_init(|| {
        std::env::var("MERGESTREAM_FAILPOINTS")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default()
    })
}

/// Aborts the process (no unwinding, no cleanup: as a SIGKILL would) if `name` is armed.
pub fn hit(name: &str) {
    if is_armed(name) {
        tracing::error!(failpoint = name, "failpoint hit: aborting");
        std::process::abort();
    }
}

/// Whether `name` is armed, for a point that slows down rather than aborts.
pub fn is_armed(name: &str) -> bool {
    armed().iter().any(|a| a == name)
}
