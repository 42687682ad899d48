//! CUDA resources released on a thread of the process's own, not on the thread that lets them
//! go: closing a peer's mapping may wait for this GPU (seen on H100), whose kernels may wait for
//! a peer that waits on that thread (zero-copy's, which answers the peers).

use std::any::Any;
use std::sync::OnceLock;
use std::sync::mpsc::{self, Sender};

/// Drops `resource` soon, on the releasing thread (started on first use); `Err` gives it back
/// where that thread cannot be had. A resource sent after that thread is gone (it never ends by
/// itself) is kept, never released here.
pub fn release_later<T: Send + 'static>(resource: T) -> Result<(), T> {
    static THREAD: OnceLock<Option<Sender<Box<dyn Any + Send>>>> = OnceLock::new();
    let thread = THREAD.get_or_init(|| {
        let (sender, resources) = mpsc::channel::<Box<dyn Any + Send>>();
        std::thread::Builder::new()
            .name("ncclshim-release".into())
            .spawn(move || {
                // Closing a mapping must not invalidate a capture another thread makes.
                let _relaxed = super::RelaxedCapture::where_driver();
                resources.into_iter().for_each(drop)
            })
            .ok()
            .map(|_| sender)
    });
    let Some(thread) = thread else {
        return Err(resource);
    };
    if let Err(unsent) = thread.send(Box::new(resource)) {
        std::mem::forget(unsent.0);
    }
    Ok(())
}
