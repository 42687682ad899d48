//! A failed driver call, named: every call of the core's returns `Cuda<T>`.

use std::fmt;

use cudarc::driver::{result, sys};

/// A failed driver call: which one, and the driver's error.
#[derive(Debug)]
pub struct CudaError {
    pub call: &'static str,
    pub error: String,
}

impl CudaError {
    /// A launch that panicked instead of returning.
    pub fn panicked() -> CudaError {
        CudaError {
            call: "launch",
            error: "panicked".to_string(),
        }
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.call, self.error)
    }
}

pub type Cuda<T> = Result<T, CudaError>;

pub(super) fn check(call: &'static str, result: sys::CUresult) -> Cuda<()> {
    if result == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError {
            call,
            error: format!("{result:?}"),
        })
    }
}

pub(super) trait Named<T> {
    fn named(self, call: &'static str) -> Cuda<T>;
}

impl<T> Named<T> for Result<T, result::DriverError> {
    fn named(self, call: &'static str) -> Cuda<T> {
        self.map_err(|e| CudaError {
            call,
            error: format!("{:?}", e.0),
        })
    }
}
