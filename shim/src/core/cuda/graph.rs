//! Launching kernels through a graph of one kernel node (`KernelGraph`): a launch sets the
//! node's kernel, grid and arguments (where they changed), then launches the graph. That takes
//! the driver's host time about 1.2 us less than a kernel launch, and the GPU about 0.8 us more
//! between launches back to back (tests/gpu/launch_cost.cu on H200). A graph's launches run one
//! after the other, in the order they were made, whatever their streams.

use std::ffi::c_void;

use super::device::Device;
use super::error::{Cuda, check};
use super::handles::{Function, Stream};
use super::module::LaunchMode;
use cudarc::driver::sys;

/// A graph of one kernel node and its executable graph, in one device's context; destroyed when
/// dropped (launches still running finish first: the driver frees the graph after them).
pub struct KernelGraph {
    graph: sys::CUgraph,
    node: sys::CUgraphNode,
    exec: sys::CUgraphExec,
    device: Device,
}

// SAFETY: CUDA graphs may be used from any thread; the owner never uses one from two at once
// (it is behind a lock).
unsafe impl Send for KernelGraph {}

/// The node's parameters for a launch of `function` with `params`.
fn node_params(
    function: Function,
    blocks: u32,
    threads: u32,
    params: &mut [*mut c_void],
) -> sys::CUDA_KERNEL_NODE_PARAMS {
    sys::CUDA_KERNEL_NODE_PARAMS {
        func: function,
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        kernelParams: params.as_mut_ptr(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

impl KernelGraph {
    /// A graph whose node launches `function` with `params` (copied), in `device`'s context,
    /// which is current; in the remote memory synchronization domain where `mode` says, as the
    /// core's other launches (programmatic stream serialization has no meaning for a graph's
    /// launch: its kernel starts once the stream's work before it is done).
    ///
    /// # Safety
    /// `params` match `function`'s parameters and point to live values.
    pub unsafe fn new(
        device: Device,
        function: Function,
        blocks: u32,
        threads: u32,
        params: &mut [*mut c_void],
        mode: LaunchMode,
    ) -> Cuda<KernelGraph> {
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("cuGraphCreate", unsafe {
            sys::cuGraphCreate(&mut graph, 0)
        })?;
        let mut made = KernelGraph {
            graph,
            node: std::ptr::null_mut(),
            exec: std::ptr::null_mut(),
            device,
        };
        let node_params = node_params(function, blocks, threads, params);
        // SAFETY: our graph, no dependencies; the caller's parameters, which the node copies.
        check("cuGraphAddKernelNode", unsafe {
            sys::cuGraphAddKernelNode_v2(&mut made.node, graph, std::ptr::null(), 0, &node_params)
        })?;
        if mode.remote_domain {
            // SAFETY: plain data, the domain set below.
            let mut value: sys::CUkernelNodeAttrValue = unsafe { std::mem::zeroed() };
            value.memSyncDomain = sys::CUlaunchMemSyncDomain::CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
            // SAFETY: our node; reads one value.
            check("cuGraphKernelNodeSetAttribute", unsafe {
                sys::cuGraphKernelNodeSetAttribute(
                    made.node,
                    sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
                    &value,
                )
            })?;
        }
        // SAFETY: our graph; writes one handle.
        check("cuGraphInstantiateWithFlags", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut made.exec, graph, 0)
        })?;
        Ok(made)
    }

    /// Sets the node to launch `function` with `params` (copied) from the next launch on; a
    /// launch already made keeps what it was made with.
    ///
    /// # Safety
    /// As for `new`.
    pub unsafe fn set(
        &mut self,
        function: Function,
        blocks: u32,
        threads: u32,
        params: &mut [*mut c_void],
    ) -> Cuda<()> {
        let node_params = node_params(function, blocks, threads, params);
        // SAFETY: our executable graph and its node; the caller's parameters, copied.
        check("cuGraphExecKernelNodeSetParams", unsafe {
            sys::cuGraphExecKernelNodeSetParams_v2(self.exec, self.node, &node_params)
        })
    }

    /// Loads the executable graph on the GPU on `stream`, ahead of its first launch.
    ///
    /// # Safety
    /// `stream` is a live stream of the graph's context, not being captured.
    pub unsafe fn upload(&self, stream: Stream) -> Cuda<()> {
        // SAFETY: our executable graph; the caller's stream.
        check("cuGraphUpload", unsafe {
            sys::cuGraphUpload(self.exec, stream)
        })
    }

    /// Launches the node as last set (by `new` or `set`) on `stream`, after the graph's earlier
    /// launches, in the current context (the graph's).
    ///
    /// # Safety
    /// `stream` is a live stream of the graph's context, not being captured.
    pub unsafe fn launch(&mut self, stream: Stream) -> Cuda<()> {
        // SAFETY: our executable graph; the caller's stream.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.exec, stream)
        })
    }
}

impl Drop for KernelGraph {
    fn drop(&mut self) {
        let Ok(_context) = self.device.enter() else {
            return;
        };
        if !self.exec.is_null() {
            // SAFETY: ours; one still running is freed once it completes.
            let _ = unsafe { sys::cuGraphExecDestroy(self.exec) };
        }
        // SAFETY: ours, not used after this.
        let _ = unsafe { sys::cuGraphDestroy(self.graph) };
    }
}
