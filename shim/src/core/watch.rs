//! The watcher: a thread of ours, started with the first core, that looks every second for
//! kernels that gave up waiting for a peer (NCCLSHIM_TIMEOUT), so that the WARN comes even where
//! the program never asks.

use std::sync::Once;
use std::time::Duration;

/// Starts the thread, once per process, running `look` every second.
pub fn start(look: fn()) {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("ncclshim-watch".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                    look();
                }
            });
        // Without the thread, the WARN comes at the communicator's next call instead.
        drop(spawned);
    });
}
