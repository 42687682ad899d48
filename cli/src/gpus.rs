//! The GPUs of this machine as the CUDA driver sees them: name, architecture, memory, and which
//! pairs can reach each other's memory (peer access) and how well (the driver's performance
//! rank: 0 is the best link, NVLink where there is one).

use cudarc::driver::{result, sys};

pub struct Gpu {
    pub ordinal: i32,
    pub name: String,
    pub arch: (i32, i32),
    pub memory_bytes: usize,
}

pub struct Machine {
    pub driver_version: i32,
    pub gpus: Vec<Gpu>,
    /// `peers[a][b]`: whether GPU a can access GPU b's memory, and the link's performance rank.
    pub peers: Vec<Vec<Option<(bool, i32)>>>,
}

/// What the driver says, or why it cannot (no libcuda, no GPU).
pub fn machine() -> Result<Machine, String> {
    // SAFETY: only tries to dlopen libcuda (cudarc panics on use without it).
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda.so.1 cannot be loaded)".into());
    }
    result::init().map_err(|e| format!("cuInit: {e:?}"))?;
    let mut driver_version = 0;
    // SAFETY: an int to write.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) };
    let count = result::device::get_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
    let mut gpus = Vec::new();
    let mut handles = Vec::new();
    for ordinal in 0..count {
        let device = result::device::get(ordinal).map_err(|e| format!("cuDeviceGet: {e:?}"))?;
        let attribute = |a| {
            // SAFETY: a valid device and attribute.
            unsafe { result::device::get_attribute(device, a) }.unwrap_or(-1)
        };
        use sys::CUdevice_attribute::*;
        gpus.push(Gpu {
            ordinal,
            name: result::device::get_name(device).unwrap_or_else(|_| "?".into()),
            arch: (
                attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            ),
            // SAFETY: a valid device.
            memory_bytes: unsafe { result::device::total_mem(device) }.unwrap_or(0),
        });
        handles.push(device);
    }
    let peers = handles
        .iter()
        .map(|&a| {
            handles
                .iter()
                .map(|&b| (a != b).then(|| peer_link(a, b)))
                .collect()
        })
        .collect();
    Ok(Machine {
        driver_version,
        gpus,
        peers,
    })
}

fn peer_link(a: sys::CUdevice, b: sys::CUdevice) -> (bool, i32) {
    let (mut access, mut rank) = (0, -1);
    // SAFETY: two valid devices; ints to write.
    unsafe {
        sys::cuDeviceCanAccessPeer(&mut access, a, b);
        sys::cuDeviceGetP2PAttribute(
            &mut rank,
            sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
            a,
            b,
        );
    }
    (access == 1, rank)
}
