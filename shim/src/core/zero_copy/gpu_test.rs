//! Zero-copy through the driver, between two real processes on one GPU (CUDA IPC works between
//! processes of one device): what the CPU tests fake. Needs a GPU, so ignored by default:
//! `cargo test -p ncclshim --lib zero_copy::gpu_test -- --ignored`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::super::cuda::Stream;
use super::super::cuda::{self, Device, DeviceBuffer, HostControl, OwnedStream};
use super::super::types::Collective::AllReduce;
use super::{Allocation, DeviceMemory, Mapped, Marker, Memory, Origin, Service, Shared, ZeroCopy};

/// The driver's memory, with every buffer id hidden: what zero-copy would be without them.
struct WithoutIds(DeviceMemory);

impl Memory for WithoutIds {
    fn allocation_of(&self, pointer: u64) -> Option<Allocation> {
        self.0
            .allocation_of(pointer)
            .map(|a| Allocation { id: 0, ..a })
    }
    /// Without ids no allocation tells its successor at its place apart, nor is seen to go.
    fn gone(&self, allocations: &[Allocation]) -> Vec<bool> {
        vec![false; allocations.len()]
    }
    fn share(&self, allocation: &Allocation) -> Result<Shared, String> {
        self.0.share(allocation)
    }
    fn open(
        &self,
        shared: Shared,
        size: u64,
        origin: Option<Origin>,
    ) -> Result<Box<dyn Mapped>, String> {
        self.0.open(shared, size, origin)
    }
    fn marker(&self, stream: Stream) -> Option<Marker> {
        self.0.marker(stream)
    }
}

const TEST: &str = "core::zero_copy::gpu_test::";
const BYTES: usize = 1 << 20;

/// Waits for `name` in `dir` and returns its text.
fn await_file(dir: &Path, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(text) = std::fs::read_to_string(dir.join(name))
            && text.ends_with('\n')
        {
            return text.trim().to_string();
        }
        assert!(Instant::now() < deadline, "{name} never came");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn post(dir: &Path, name: &str, text: &str) {
    let temporary = dir.join(format!("{name}.part"));
    std::fs::write(&temporary, format!("{text}\n")).unwrap();
    std::fs::rename(temporary, dir.join(name)).unwrap();
}

/// `chunks` cuMem allocations of `chunk` bytes each mapped one after the other in one
/// reservation, shareable as file descriptors: one as ncclMemAlloc makes them, several as
/// PyTorch's expandable segments do (the driver's range attributes then give the reservation;
/// cuMemGetAddressRange and the buffer id, each allocation). Returns the reservation's start.
/// Leaked: the process ends soon after.
fn cumem(device: Device, chunk: usize, chunks: u64) -> u64 {
    use cudarc::driver::sys;
    let mut start: u64 = 0;
    // SAFETY: reserves a fresh range; the address is written.
    let reserved =
        unsafe { sys::cuMemAddressReserve(&mut start, chunks as usize * chunk, 0, 0, 0) };
    assert_eq!(reserved, sys::CUresult::CUDA_SUCCESS);
    for k in 0..chunks {
        map_chunk(device, start + k * chunk as u64, chunk);
    }
    start
}

/// A new cuMem allocation of `chunk` bytes, shareable as a file descriptor, mapped at `at` (a
/// free place of a reservation of ours) for `device`.
fn map_chunk(device: Device, at: u64, chunk: usize) {
    use cudarc::driver::sys;
    // SAFETY: plain data; the fields the driver reads are set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device.ordinal;
    prop.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    let access = sys::CUmemAccessDesc {
        location: prop.location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    let mut handle = 0;
    // SAFETY: driver calls on our own reservation and a new allocation; results checked. The
    // handle is released at once: the mapping keeps the memory until unmapped.
    unsafe {
        let results = [
            sys::cuMemCreate(&mut handle, chunk, &prop, 0),
            sys::cuMemMap(at, chunk, 0, handle, 0),
            sys::cuMemRelease(handle),
            sys::cuMemSetAccess(at, chunk, &access, 1),
        ];
        assert!(
            results.iter().all(|&r| r == sys::CUresult::CUDA_SUCCESS),
            "{results:?}"
        );
    }
}

/// A kernel that spins until word 0 of a host control block is raised: keeps a GPU busy.
const SPIN_PTX: &str = r#"
.version 7.8
.target sm_80
.address_size 64
.visible .entry spin(.param .u64 flag)
{
  .reg .u64 %rd<2>;
  .reg .u32 %r<2>;
  .reg .pred %p<2>;
  ld.param.u64 %rd0, [flag];
WAIT:
  ld.volatile.global.u32 %r0, [%rd0];
  setp.eq.u32 %p0, %r0, 0;
  @%p0 bra WAIT;
  ret;
}
"#;

/// Keeps `device` busy with a spinning kernel on a stream of its own until dropped.
struct Busy {
    control: HostControl,
    stream: OwnedStream,
}

impl Busy {
    fn start(device: Device) -> Busy {
        let control = HostControl::new(0).unwrap();
        let stream = OwnedStream::create(device).unwrap();
        let mut ptx = SPIN_PTX.as_bytes().to_vec();
        ptx.push(0);
        let module = cuda::load_module(&ptx).unwrap();
        let function = cuda::get_function(module, "spin").unwrap();
        let mut flag = control.device;
        let mut params: [*mut std::ffi::c_void; 1] = [(&raw mut flag).cast()];
        // SAFETY: the kernel's one parameter, a pointer to mapped pinned memory.
        unsafe {
            cuda::launch(
                function,
                1,
                1,
                stream.stream,
                &mut params,
                cuda::LaunchMode::PLAIN,
            )
        }
        .unwrap();
        Busy { control, stream }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.control.raise_abort();
        self.stream.synchronize().unwrap();
    }
}

/// Rank `rank`'s zero-copy side of communicator `comm`, on a service of its own, once the other
/// rank has joined too.
fn join_both(
    rank: usize,
    dir: &Path,
    processes: Vec<u64>,
    comm: u64,
    memory: Box<dyn Memory>,
) -> std::sync::Arc<ZeroCopy> {
    let service = Service::start(processes[rank]).unwrap();
    let member = ZeroCopy::join(service, comm, rank, processes, memory);
    post(dir, &format!("joined{rank}"), "yes");
    await_file(dir, &format!("joined{}", 1 - rank));
    member
}

/// Rank 0 offers a buffer, then frees it and allocates again at the same address with other
/// contents; rank 1 reads each through the address zero-copy gave rank 0 for it. Rank 1's GPU
/// is kept busy meanwhile (as by a kernel waiting for rank 0): its service must answer anyway.
fn role(rank: usize, dir: &Path, processes: Vec<u64>, ids: bool) {
    cuda::init().unwrap();
    let device = Device::open(0).unwrap();
    device.make_current().unwrap();
    let memory: Box<dyn Memory> = if ids {
        Box::new(DeviceMemory(device))
    } else {
        Box::new(WithoutIds(DeviceMemory(device)))
    };
    let member = join_both(rank, dir, processes, 42, memory);
    let stream = OwnedStream::create(device).unwrap();
    if rank == 0 {
        let mut bases = Vec::new();
        for (round, value) in [(1, 0x11u8), (2, 0x22u8)] {
            let buffer = DeviceBuffer::alloc(device, BYTES).unwrap();
            stream.fill(buffer.pointer, value, BYTES).unwrap();
            bases.push(buffer.pointer);
            let started = Instant::now();
            let (addresses, _) = member
                .addresses(buffer.pointer + 256, 4096, buffer.pointer + 256, 4096)
                .expect("rank 1 maps the buffer");
            println!(
                "round {round}: buffer {:#x}, rank 1's address {:#x}, first call {:.1} ms",
                buffer.pointer,
                addresses.input[1],
                started.elapsed().as_secs_f64() * 1e3
            );
            let started = Instant::now();
            let again = member
                .addresses(buffer.pointer, 4096, buffer.pointer, 4096)
                .unwrap()
                .0;
            println!(
                "round {round}: next call {:.1} us",
                started.elapsed().as_secs_f64() * 1e6
            );
            assert_eq!(again.input[1] + 256, addresses.input[1]);
            post(
                dir,
                &format!("round{round}"),
                &format!("{} {value}", addresses.input[1]),
            );
            let read = await_file(dir, &format!("read{round}"));
            if round == 1 || ids {
                assert_eq!(read, "right");
            } else {
                post(dir, "outcome", &read);
            }
            // Freed here; the next round's allocation is likely to land at the same address.
        }
        println!(
            "same address both rounds: {}",
            if bases[0] == bases[1] { "yes" } else { "no" }
        );
        // Round 3: cuMem memory of one allocation (ncclMemAlloc's), by file descriptor.
        let chunk = 2 << 20;
        let start = cumem(device, chunk, 1);
        stream.fill(start, 0x33, chunk).unwrap();
        let inside = start + 256;
        let allocation = super::device_memory::shareable_allocation(inside, device.ordinal);
        println!("round 3: allocation {allocation:x?}");
        let addresses = first_call(&member, inside, "round 3: the cuMem buffer");
        // Several allocations in one reservation (PyTorch's expandable segments): a buffer in
        // one of them, and one across both, which rank 1 maps side by side.
        let pair = cumem(device, chunk, 2);
        stream.fill(pair, 0x44, 2 * chunk).unwrap();
        let second = pair + chunk as u64 + 512;
        println!(
            "round 3: the second of two allocations: {:x?}",
            super::device_memory::shareable_allocation(second, device.ordinal)
        );
        let in_second = first_call(&member, second, "round 3: in the second of two allocations");
        let across = pair + chunk as u64 - 256;
        let across_both = first_call(&member, across, "round 3: across two allocations");
        assert_eq!(across_both.input[1] + 256 + 512, in_second.input[1]);
        post(dir, "round3", &format!("{} 51", addresses.input[1]));
        assert_eq!(await_file(dir, "read3"), "right");
        post(dir, "round4", &format!("{} 68", in_second.input[1]));
        assert_eq!(await_file(dir, "read4"), "right");
        post(dir, "round5", &format!("{} 68", across_both.input[1]));
        assert_eq!(await_file(dir, "read5"), "right");
        // The second allocation freed and made again at its place (PyTorch's expandable segments
        // after empty_cache): rank 1, its GPU busy, closes its old mapping and maps the new one
        // at the same place, so a buffer across both stays one range.
        // Without ids the new allocation looks like the old one: not offered again.
        if ids {
            // SAFETY: our own mapping, used by nothing queued.
            let unmapped = unsafe { cudarc::driver::sys::cuMemUnmap(pair + chunk as u64, chunk) };
            assert_eq!(unmapped, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
            map_chunk(device, pair + chunk as u64, chunk);
            stream.fill(pair + chunk as u64, 0x66, chunk).unwrap();
            let again = first_call(&member, across, "round 6: made again");
            assert_eq!(again.input[1], across_both.input[1], "not at its place");
            post(dir, "round6", &format!("{} 102", in_second.input[1]));
            assert_eq!(await_file(dir, "read6"), "right");
        }
    } else {
        let busy = Busy::start(device);
        let rounds = if ids { 6 } else { 5 };
        for round in 1..=rounds {
            let text = await_file(dir, &format!("round{round}"));
            let (address, value) = text.split_once(' ').unwrap();
            let (address, value): (u64, u8) = (address.parse().unwrap(), value.parse().unwrap());
            let mut seen = vec![0u8; 4096];
            cuda::copy_to_host(&mut seen, address).unwrap();
            let right = seen.iter().all(|&b| b == value);
            println!("round {round}: read {:#x}, right: {right}", seen[0]);
            post(
                dir,
                &format!("read{round}"),
                if right { "right" } else { "stale" },
            );
        }
        drop(busy);
    }
    drop(member);
}

/// Rank 0 offers 1 GiB of cuMem memory (as PyTorch's expandable segments and ncclMemAlloc make),
/// which rank 1 maps and reads; rank 0 frees it and makes no other call: the memory must be free
/// again (both processes are on one GPU) once its service's sweep retired it and rank 1 closed
/// its mapping, not when the communicator goes.
fn freed_memory_role(rank: usize, dir: &Path, processes: Vec<u64>) {
    const GIB: usize = 1 << 30;
    cuda::init().unwrap();
    let device = Device::open(0).unwrap();
    device.make_current().unwrap();
    let member = join_both(rank, dir, processes, 43, Box::new(DeviceMemory(device)));
    if rank == 1 {
        let text = await_file(dir, "mapped");
        let mut seen = vec![0u8; 4096];
        cuda::copy_to_host(&mut seen, text.parse().unwrap()).unwrap();
        assert!(seen.iter().all(|&b| b == 0x5a), "read {:#x}", seen[0]);
        post(dir, "read", "right");
        // Still mapped after several sweeps while the allocation lives.
        await_file(dir, "again");
        cuda::copy_to_host(&mut seen, text.parse().unwrap()).unwrap();
        assert!(seen.iter().all(|&b| b == 0x5a), "read {:#x}", seen[0]);
        post(dir, "read again", "right");
        await_file(dir, "done");
        drop(member);
        return;
    }
    let stream = OwnedStream::create(device).unwrap();
    let start = cumem(device, GIB, 1);
    stream.fill(start, 0x5a, 4096).unwrap();
    let addresses = first_call(&member, start, "1 GiB of cuMem memory");
    post(dir, "mapped", &addresses.input[1].to_string());
    assert_eq!(await_file(dir, "read"), "right");
    // A live allocation is never retired: after several sweeps, the same offer.
    std::thread::sleep(super::SWEEP_EVERY * 5);
    let again = first_call(&member, start, "1 GiB of cuMem memory, again");
    assert_eq!(again.input[1], addresses.input[1]);
    assert_eq!(member.offered.load(std::sync::atomic::Ordering::Relaxed), 1);
    post(dir, "again", "yes");
    assert_eq!(await_file(dir, "read again"), "right");
    let free_now = || cudarc::driver::result::mem_get_info().unwrap().0;
    let before = free_now();
    // SAFETY: our own mapping, used by nothing queued; its handle was released when mapped.
    let unmapped = unsafe { cudarc::driver::sys::cuMemUnmap(start, GIB) };
    assert_eq!(unmapped, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
    let freed = Instant::now();
    let at_once = free_now();
    let deadline = freed + Duration::from_secs(5);
    while free_now() < before + GIB * 9 / 10 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let back = free_now();
    println!(
        "freed 1 GiB rank 1 had mapped: at once {:+.2} GiB free, after {:.1} ms {:+.2} GiB",
        (at_once as f64 - before as f64) / GIB as f64,
        freed.elapsed().as_secs_f64() * 1e3,
        (back as f64 - before as f64) / GIB as f64
    );
    post(dir, "done", "yes");
    assert!(
        back >= before + GIB * 9 / 10,
        "the peer still holds the memory after 5 s"
    );
    drop(member);
}

/// Every rank's address of 4 KiB at `pointer`, in place, which rank 1 must map in time; says
/// how long the call took (the first on a new buffer waits for rank 1's answer).
fn first_call(member: &ZeroCopy, pointer: u64, what: &str) -> super::Addresses {
    let started = Instant::now();
    let (addresses, _) = member
        .addresses(pointer, 4096, pointer, 4096)
        .unwrap_or_else(|| panic!("{what}: rank 1 did not map it"));
    println!(
        "{what}: rank 1's address {:#x}, first call {:.1} ms",
        addresses.input[1],
        started.elapsed().as_secs_f64() * 1e3
    );
    addresses
}

/// Launches `plan` on `core` from `input` into `output` on `stream`, waits for it, and returns
/// the `bytes` it left at `output`.
fn launch_and_read(
    core: &super::super::comm::CoreComm,
    plan: &super::super::policy::Plan,
    input: cuda::DevicePtr,
    output: cuda::DevicePtr,
    stream: &OwnedStream,
    bytes: usize,
) -> Vec<u8> {
    core.launch(
        plan,
        input as *const std::ffi::c_void,
        output as *mut std::ffi::c_void,
        stream.stream,
    )
    .unwrap();
    stream.synchronize().unwrap();
    let mut got = vec![0u8; bytes];
    cuda::copy_to_host(&mut got, output).unwrap();
    got
}

/// An all-reduce (sum) of `bytes` bytes on two ranks, each rank's input all one byte that
/// `round` moves on, at `offset` from 16-aligned buffers made for it (so that zero-copy offers
/// them anew): in place or not.
struct ByteSum {
    bytes: usize,
    offset: usize,
    inplace: bool,
    round: u8,
}

impl ByteSum {
    fn plan(&self, facts: &super::super::policy::CommFacts) -> super::super::policy::Plan {
        use super::super::policy;
        policy::plan_args(policy::settings(), AllReduce, self.bytes, 1, 0, -1, facts).unwrap()
    }

    /// Runs it on `core` and returns how many bytes came out wrong.
    fn run(
        &self,
        core: &super::super::comm::CoreComm,
        device: Device,
        stream: &OwnedStream,
        rank: usize,
        facts: &super::super::policy::CommFacts,
    ) -> usize {
        let Self {
            bytes,
            offset,
            inplace,
            round,
        } = *self;
        let send = DeviceBuffer::alloc(device, bytes + 64).unwrap();
        let recv = DeviceBuffer::alloc(device, bytes + 64).unwrap();
        let mine = 0x11 * (rank as u8 + 1) + round;
        stream.fill(send.pointer, mine, bytes + 64).unwrap();
        stream
            .fill(recv.pointer, if inplace { mine } else { 0 }, bytes + 64)
            .unwrap();
        let input = if inplace { recv.pointer } else { send.pointer } + offset as u64;
        let output = recv.pointer + offset as u64;
        let plan = self.plan(facts);
        let got = launch_and_read(core, &plan, input, output, stream, bytes);
        let want = 0x11u8.wrapping_add(0x22).wrapping_add(2 * round);
        let bad = got.iter().filter(|&&b| b != want).count();
        println!(
            "rank {rank} round {round}: {bytes} B at +{offset}{} ({:?}): {bad} wrong",
            if inplace { " in place" } else { "" },
            plan.algorithm
        );
        // Freed here: the next buffers are likely to come back at the same addresses.
        bad
    }
}

/// A core of two ranks (one per process) whose direct calls go through zero-copy, on GPU 0,
/// and what it was made with: its facts, this rank's buffer and its zero-copy member.
fn zero_copy_core(
    rank: usize,
    dir: &Path,
    processes: Vec<u64>,
) -> (
    super::super::comm::CoreComm,
    super::super::policy::CommFacts,
    cuda::DevicePtr,
    std::sync::Arc<ZeroCopy>,
    Device,
) {
    use super::super::comm::{CoreComm, Reach};
    use super::super::policy::CommFacts;
    cuda::init().unwrap();
    let device = Device::open(0).unwrap();
    device.make_current().unwrap();
    let (parts, bases, peer) = exchange_buffers(rank, dir, device, "core");
    let zero_copy = join_both(rank, dir, processes, 43, Box::new(DeviceMemory(device)));
    let facts = CommFacts {
        nranks: 2,
        single_process: false,
        zero_copy: true,
        resident_blocks: parts.kernels.two_shot_resident_blocks,
        compute_capability: parts.kernels.compute_capability(),
        measured: crate::core::measured::Measured::NONE,
        max_blocks: u32::MAX,
        copy_engines: false,
    };
    let own = bases[rank];
    let core = CoreComm::new(
        rank,
        true,
        facts,
        parts,
        Reach {
            bases,
            opened: vec![peer],
            peer_devices: Vec::new(),
            zero_copy: Some(zero_copy.clone()),
        },
    );
    (core, facts, own, zero_copy, device)
}

/// The core's direct all-reduce between two processes on one GPU (their kernels take turns on
/// it, so slowly): each rank's core set up by hand (no NCCL, which takes one GPU per rank), user
/// buffers reached through zero-copy. u8 sums of every size band the direct kernel takes, in
/// and out of place, misaligned (the staged path), on buffers made again between rounds; in CUDA
/// graphs; the other collectives; batches, through the graph set-up makes; through the routed
/// path, traced, and on a stream the program destroys before its next call, on another stream.
fn core_role(rank: usize, dir: &Path, processes: Vec<u64>) {
    use super::super::types::Algorithm;
    let (core, facts, _, zero_copy, device) = zero_copy_core(rank, dir, processes);
    let stream = OwnedStream::create(device).unwrap();
    let mut wrong = 0usize;
    for round in 0..3u8 {
        for (bytes, offset, inplace) in [
            (4usize << 20, 0usize, false),
            (4 << 20, 0, true),
            (3 << 20, 0, false),
            (8 << 20, 0, false),
            (4 << 20, 1, false),
        ] {
            let call = ByteSum {
                bytes,
                offset,
                inplace,
                round,
            };
            assert_eq!(call.plan(&facts).algorithm, Algorithm::Direct);
            wrong += call.run(&core, device, &stream, rank, &facts);
        }
    }
    wrong += graph_replays(&core, device, &stream, rank, &facts);
    wrong += other_collectives(&core, device, &stream, rank, &facts);
    // The graph groups share, made as set-up makes it: the batches' groups, launched once or
    // twice each, set it and make no other.
    core.ready_graphs();
    assert_eq!(core.graphs_made(), 1);
    wrong += batches(&core, device, &stream, rank, &facts);
    assert_eq!(core.graphs_made(), 1);
    // Through the routed path under a made-up handle, traced and timed (NCCLSHIM_TRACE and
    // NCCLSHIM_TRACE_TIMING=1 come from the parent): each call's GPU time is in the trace.
    let comm = (0x7e57_0000 + 0x100 * rank) as crate::ffi::ncclComm_t;
    super::super::lifecycle::made(comm, true);
    let taken = super::super::lifecycle::came_on(comm, std::sync::Arc::new(core));
    assert!(taken.is_ok(), "a communicator made just now takes its core");
    super::super::observer::observer().core_decided(comm, true, rank as i32, 2, device.ordinal);
    let kind = crate::ffi::OPERATIONS
        .iter()
        .position(|name| *name == "ncclAllReduce")
        .unwrap() as u8;
    let bytes = 8usize << 20;
    let (send, recv) = (
        DeviceBuffer::alloc(device, bytes).unwrap(),
        DeviceBuffer::alloc(device, bytes).unwrap(),
    );
    // An all-reduce of `count` bytes on `on`, through the routed path.
    let call_of = |count: usize, on: cuda::Stream| crate::call::Call {
        kind,
        comm,
        send: send.pointer as *const std::ffi::c_void,
        recv: recv.pointer as *mut std::ffi::c_void,
        count,
        datatype: 1,
        op: Some(0),
        root: None,
        stream: on as crate::ffi::cudaStream_t,
    };
    for _ in 0..5 {
        let call = call_of(bytes, stream.stream);
        let result = super::super::operation(&call, || crate::ffi::ncclInternalError);
        crate::calls::operation_done(&call, result);
        assert_eq!(result, crate::ffi::ncclSuccess);
    }
    // A call on a stream the program then destroys, and the next on another: the core orders
    // the two without asking the destroyed stream anything (the driver faults on it).
    let call_on = |on: cuda::Stream| {
        let result = super::super::operation(&call_of(4096, on), || crate::ffi::ncclInternalError);
        assert_eq!(result, crate::ffi::ncclSuccess);
    };
    stream.fill(send.pointer, rank as u8 + 1, 4096).unwrap();
    for round in 0..2 {
        let passing = OwnedStream::create(device).unwrap();
        stream.fill(recv.pointer, 0, 4096).unwrap();
        call_on(passing.stream);
        // Destroyed with the call still queued on it (CUDA lets its work finish).
        drop(passing);
        call_on(stream.stream);
        stream.synchronize().unwrap();
        let mut got = vec![0u8; 4096];
        cuda::copy_to_host(&mut got, recv.pointer).unwrap();
        let bad = got.iter().filter(|&&b| b != 3).count();
        println!(
            "rank {rank} round {round}: calls on a destroyed stream then another: {bad} wrong"
        );
        wrong += bad;
    }
    stream.synchronize().unwrap();
    drop(super::super::lifecycle::forget(comm));
    drop(zero_copy);
    assert_eq!(wrong, 0);
}

/// A communicator far along: every slot of the flags that its calls of large grids wrote, then
/// left 2^31 and more calls behind the ranks' count (as billions of small calls would), must
/// still read as behind once the count has passed a multiple of 2^29 (device.cuh,
/// EPOCH_REFRESH). Read as ahead, a staged call's barriers pass before the peer comes and a
/// direct call takes its peer for one on a later call and gives up. So must every packet of the
/// low-latency inboxes, which a call takes by its flag's equality with its epoch: one left
/// exactly 2^32 calls behind would pass for the peer's.
fn epochs_far_along_role(rank: usize, dir: &Path, processes: Vec<u64>) {
    use super::super::layout::EPOCH_STATE_OFFSET;
    use super::super::types::Algorithm;
    let (core, facts, own, zero_copy, device) = zero_copy_core(rank, dir, processes);
    let stream = OwnedStream::create(device).unwrap();
    let sum = |bytes: usize, offset: usize, round: u8| ByteSum {
        bytes,
        offset,
        inplace: false,
        round,
    };
    let run_all = |calls: &[ByteSum]| -> usize {
        (calls.iter())
            .map(|call| call.run(&core, device, &stream, rank, &facts))
            .sum()
    };
    // Both ranks idle, each moves its count to `count`.
    let move_count = |count: u32, step: &str| {
        post(dir, &format!("idle-{step}{rank}"), "yes");
        await_file(dir, &format!("idle-{step}{}", 1 - rank));
        stream
            .copy_to_device(own + EPOCH_STATE_OFFSET as u64, &count.to_ne_bytes())
            .unwrap();
        post(dir, &format!("moved-{step}{rank}"), "yes");
        await_file(dir, &format!("moved-{step}{}", 1 - rank));
    };
    // Direct (Published and the end slots), staged (misaligned: every block's barrier slots),
    // packets (the low-latency inboxes' first slots; the others hold the set-up's zeros).
    let large = [sum(4 << 20, 0, 0), sum(4 << 20, 1, 1), sum(8 << 10, 0, 8)];
    assert_eq!(large[0].plan(&facts).algorithm, Algorithm::Direct);
    assert_eq!(large[2].plan(&facts).algorithm, Algorithm::LowLatency);
    let mut wrong = run_all(&large);
    // 2^31 and more past the epochs in the slots; small calls (packets: no slot of the flags)
    // take the count past 5 * 2^29.
    move_count((5 << 29) - 1, "far");
    let small = [sum(8 << 10, 0, 2), sum(8 << 10, 0, 3)];
    assert_eq!(small[0].plan(&facts).algorithm, Algorithm::LowLatency);
    // Timed: the first passes 5 * 2^29, and refreshes the slots and the inboxes.
    let passing = std::time::Instant::now();
    wrong += run_all(&small);
    let passing = passing.elapsed();
    wrong += run_all(&[sum(4 << 20, 0, 4), sum(4 << 20, 1, 5), sum(8 << 20, 0, 6)]);
    let far = flags_behind(&stream, own);
    let far_packets = packets_behind(&stream, own, far.0);
    // A staged call in two windows (misaligned, larger than the staging's window), whose
    // second window's epoch passes 6 * 2^29: the slots the first refresh moved and no call
    // wrote since (the barriers of ranks and blocks it has not), 2^29 behind by then, move too.
    move_count((6 << 29) - 1, "windows");
    wrong += run_all(&[sum(24 << 20, 1, 7)]);
    let windows = flags_behind(&stream, own);
    let windows_packets = packets_behind(&stream, own, windows.0);
    println!(
        "rank {rank}: most behind after passing 5 * 2^29 {far:?} (packets {far_packets}), after the windows {windows:?} (packets {windows_packets}); a wait gave up: {}",
        core.failed(std::ptr::null_mut())
    );
    assert!(!core.failed(std::ptr::null_mut()), "no wait gave up");
    assert!(far.0 > 5 << 29 && windows.0 > 6 << 29, "the count went on");
    assert!(
        far.1 < 1 << 29 && windows.1 < 1 << 29,
        "no slot 2^29 behind"
    );
    assert!(
        far_packets < 1 << 29 && windows_packets < 1 << 29,
        "no packet 2^29 behind"
    );
    // And the calls of packets still meet (the refresh left none looking like the peer's).
    let after = std::time::Instant::now();
    wrong += run_all(&[sum(8 << 10, 0, 9), sum(8 << 10, 0, 10)]);
    let after = after.elapsed();
    wrong += run_all(&[sum(64 << 10, 0, 11)]);
    println!(
        "rank {rank}: two small calls {passing:?} where the first passes 5 * 2^29, {after:?} after"
    );
    drop(core);
    drop(zero_copy);
    assert_eq!(wrong, 0);
}

/// This rank's count, and how far behind it the slot of its flags furthest behind is (the
/// meetings', the direct calls' ends and the Published pairs', device.cuh): a slot at most a few
/// calls ahead counts as 0.
fn flags_behind(stream: &OwnedStream, own: cuda::DevicePtr) -> (u32, u32) {
    use super::super::layout::EPOCH_STATE_OFFSET;
    use super::super::limits::MAX_RANKS;
    let words = EPOCH_STATE_OFFSET / 4 + 8 + MAX_RANKS + MAX_RANKS * 12;
    let mut bytes = vec![0u8; words * 4];
    stream.copy_to_host(&mut bytes, own).unwrap();
    let word = |i: usize| u32::from_ne_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    let state = EPOCH_STATE_OFFSET / 4;
    let count = word(state);
    let meetings = 0..state;
    let ends = state + 8..state + 8 + MAX_RANKS;
    // Each Published: six 8-byte halves, their flags in the upper words.
    let published = (state + 8 + MAX_RANKS..words).filter(|i| i % 2 == 1);
    let behind = most_behind(count, (meetings.chain(ends).chain(published)).map(word));
    (count, behind)
}

/// How far behind `count` the flag furthest behind among `flags` is: a flag at most a few calls
/// ahead counts as 0.
fn most_behind(count: u32, flags: impl Iterator<Item = u32>) -> u32 {
    (flags.map(|flag| count.wrapping_sub(flag)))
        .filter(|&d| d < u32::MAX - 64)
        .max()
        .unwrap_or(0)
}

/// How far behind `count` (this rank's, as `flags_behind` read it) the packet of its
/// low-latency inboxes furthest behind is (each 8-byte half: 4 data bytes, then the flag;
/// device.cuh, refresh_inbox), as `most_behind` counts.
fn packets_behind(stream: &OwnedStream, own: cuda::DevicePtr, count: u32) -> u32 {
    use super::super::layout::{FLAGS_BYTES, INBOX_BYTES, Staging};
    let mut inbox = vec![0u8; INBOX_BYTES];
    let at = own + (FLAGS_BYTES as u64) + Staging::standard().ll_inbox;
    stream.copy_to_host(&mut inbox, at).unwrap();
    let flags = inbox.chunks_exact(8);
    most_behind(
        count,
        flags.map(|half| u32::from_ne_bytes(half[4..].try_into().unwrap())),
    )
}

/// This rank's own core parts, and every rank's buffer as this rank maps it (the peer's through
/// CUDA IPC), swapped with the peer through files named after `name`.
fn exchange_buffers(
    rank: usize,
    dir: &Path,
    device: Device,
    name: &str,
) -> (
    super::super::comm::Parts,
    Vec<cuda::DevicePtr>,
    cuda::IpcMapping,
) {
    let parts = super::super::setup::own_parts(device).unwrap();
    let handle = cuda::ipc_handle(parts.buffer.pointer).unwrap();
    let hex: String = handle.iter().map(|b| format!("{b:02x}")).collect();
    post(dir, &format!("{name}{rank}"), &hex);
    let theirs = await_file(dir, &format!("{name}{}", 1 - rank));
    let mut peer_handle = [0u8; 64];
    for (i, b) in peer_handle.iter_mut().enumerate() {
        *b = u8::from_str_radix(&theirs[2 * i..2 * i + 2], 16).unwrap();
    }
    let peer = cuda::IpcMapping::open(device, &peer_handle).unwrap();
    let mut bases = vec![parts.buffer.pointer; 2];
    bases[1 - rank] = peer.pointer;
    (parts, bases, peer)
}

/// A core of two ranks without zero-copy (calls in the staging), its buffers swapped with the
/// peer through files named after `name`.
fn plain_core(rank: usize, dir: &Path, device: Device, name: &str) -> super::super::comm::CoreComm {
    use super::super::comm::{CoreComm, Reach};
    let (parts, bases, peer) = exchange_buffers(rank, dir, device, name);
    let facts = super::super::policy::CommFacts {
        nranks: 2,
        single_process: false,
        zero_copy: false,
        resident_blocks: parts.kernels.two_shot_resident_blocks,
        compute_capability: parts.kernels.compute_capability(),
        measured: crate::core::measured::Measured::NONE,
        max_blocks: u32::MAX,
        copy_engines: false,
    };
    let reach = Reach {
        bases,
        opened: vec![peer],
        peer_devices: Vec::new(),
        zero_copy: None,
    };
    CoreComm::new(rank, true, facts, parts, reach)
}

/// A stream of a green context of `sms` SMs of `device` (both leaked: the process ends soon
/// after).
fn make_green_stream(device: Device, sms: u32) -> cuda::Stream {
    use cudarc::driver::sys;
    let ok = |result: sys::CUresult| assert_eq!(result, sys::CUresult::CUDA_SUCCESS);
    let sm = sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM;
    // SAFETY: plain data, written by the driver.
    let (mut whole, mut part): (sys::CUdevResource, sys::CUdevResource) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: a device of this process; writes one resource.
    ok(unsafe { sys::cuDeviceGetDevResource(device.handle, &mut whole, sm) });
    let mut groups = 1u32;
    let nothing = std::ptr::null_mut();
    // SAFETY: one group of at least `sms` SMs out of the device's, written into `part`.
    ok(unsafe {
        sys::cuDevSmResourceSplitByCount(&mut part, &mut groups, &whole, nothing, 0, sms)
    });
    let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
    // SAFETY: the one resource above; writes one descriptor.
    ok(unsafe { sys::cuDevResourceGenerateDesc(&mut desc, &mut part, 1) });
    let mut green: sys::CUgreenCtx = std::ptr::null_mut();
    let flags = sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32;
    // SAFETY: the descriptor above, this device; writes one handle.
    ok(unsafe { sys::cuGreenCtxCreate(&mut green, desc, device.handle, flags) });
    let mut stream: sys::CUstream = std::ptr::null_mut();
    let nonblocking = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: the green context above; writes one handle.
    ok(unsafe { sys::cuGreenCtxStreamCreate(&mut stream, green, nonblocking, 0) });
    stream
}

/// A staged all-reduce (windows of the staging, the grid meeting before the last) on a stream of
/// a green context of 8 SMs, which cannot hold its grid at once: right, in time.
fn staged_on_a_green_context(rank: usize, dir: &Path) {
    use super::super::policy;
    use super::super::types::Algorithm;
    use cudarc::driver::sys;
    cuda::init().unwrap();
    let device = Device::open(0).unwrap();
    device.make_current().unwrap();
    let core = plain_core(rank, dir, device, "green");
    let bytes = (100usize << 20) + (4 << 20);
    let count = bytes / 4;
    let plan = policy::plan_args(policy::settings(), AllReduce, count, 7, 0, -1, &core.facts)
        .expect("planned");
    assert_eq!(plan.algorithm, Algorithm::TwoShot, "{plan:?}");
    let green_stream = make_green_stream(device, 8);
    println!("rank {rank}: a green context of 8 SMs");
    let stream = OwnedStream::create(device).unwrap();
    let (send, recv) = (
        DeviceBuffer::alloc(device, bytes).unwrap(),
        DeviceBuffer::alloc(device, bytes).unwrap(),
    );
    stream.fill(send.pointer, rank as u8 + 1, bytes).unwrap();
    stream.fill(recv.pointer, 0, bytes).unwrap();
    let (input, output) = (
        send.pointer as *const std::ffi::c_void,
        recv.pointer as *mut _,
    );
    let want = f32::from_le_bytes([1; 4]) + f32::from_le_bytes([2; 4]);
    let check = |how: &str, started: Instant| {
        // SAFETY: the green context's stream, made above.
        let synced = unsafe { sys::cuStreamSynchronize(green_stream) };
        let took = started.elapsed();
        let mut got = vec![0u8; bytes];
        cuda::copy_to_host(&mut got, recv.pointer).unwrap();
        let bad = (got.chunks(4))
            .filter(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]) != want)
            .count();
        println!(
            "rank {rank}: staged all-reduce of {bytes} B in {} blocks on the green stream, {how}: {synced:?}, {bad} wrong, {took:?}",
            plan.blocks
        );
        assert!(!core.failed(std::ptr::null_mut()), "a wait gave up");
        assert_eq!(bad, 0);
    };
    let started = Instant::now();
    core.launch(&plan, input, output, green_stream).unwrap();
    check("eager", started);
    // Captured on the green stream (the core's own stream joins the capture and leaves it),
    // replayed, then eager again.
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: driver calls on the green stream, our graph and buffers; results checked.
    unsafe {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        let began = sys::cuStreamBeginCapture_v2(green_stream, mode);
        assert_eq!(began, sys::CUresult::CUDA_SUCCESS);
        core.launch(&plan, input, output, green_stream).unwrap();
        let ended = sys::cuStreamEndCapture(green_stream, &mut graph);
        assert_eq!(ended, sys::CUresult::CUDA_SUCCESS);
        let made = sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0);
        assert_eq!(made, sys::CUresult::CUDA_SUCCESS);
    }
    stream.fill(recv.pointer, 0, bytes).unwrap();
    let started = Instant::now();
    // SAFETY: our instantiated graph, on the green stream.
    let replayed = unsafe { sys::cuGraphLaunch(exec, green_stream) };
    assert_eq!(replayed, sys::CUresult::CUDA_SUCCESS);
    check("replayed from a graph", started);
    // Two captures open at once, on two green streams: each takes a core stream of its own (one
    // in a capture can join no other). Replayed one after the other.
    let other = make_green_stream(device, 8);
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
    let mut execs = [std::ptr::null_mut(); 2];
    for on in [green_stream, other] {
        // SAFETY: a green stream of ours, not capturing yet.
        let began = unsafe { sys::cuStreamBeginCapture_v2(on, mode) };
        assert_eq!(began, sys::CUresult::CUDA_SUCCESS);
        core.launch(&plan, input, output, on).unwrap();
    }
    let mut graphs = [std::ptr::null_mut(); 2];
    for (k, on) in [green_stream, other].into_iter().enumerate() {
        // SAFETY: the capture begun above on `on`; writes one graph.
        let ended = unsafe { sys::cuStreamEndCapture(on, &mut graphs[k]) };
        assert_eq!(ended, sys::CUresult::CUDA_SUCCESS, "capture {k}");
    }
    // Once no capture is open (instantiating is not allowed during a global one).
    for (exec, graph) in execs.iter_mut().zip(graphs) {
        // SAFETY: a graph captured above; writes one executable.
        let made = unsafe { sys::cuGraphInstantiateWithFlags(exec, graph, 0) };
        assert_eq!(made, sys::CUresult::CUDA_SUCCESS);
    }
    for (k, exec) in execs.into_iter().enumerate() {
        stream.fill(recv.pointer, 0, bytes).unwrap();
        let started = Instant::now();
        // SAFETY: our instantiated graph, on the green stream (waited for in `check`).
        let replayed = unsafe { sys::cuGraphLaunch(exec, green_stream) };
        assert_eq!(replayed, sys::CUresult::CUDA_SUCCESS);
        check(
            &format!("replayed from one of two graphs captured at once ({k})"),
            started,
        );
    }
    stream.fill(recv.pointer, 0, bytes).unwrap();
    let started = Instant::now();
    core.launch(&plan, input, output, green_stream).unwrap();
    check("eager after the graphs", started);
}

/// Device buffers held in this process before and after `comm`'s memory is suspended
/// (`core::suspending`, outside any group).
fn buffers_around_suspension(comm: crate::ffi::ncclComm_t) -> (usize, usize) {
    let (held, _) = cuda::live_resources();
    super::super::suspending(comm);
    let (left, _) = cuda::live_resources();
    (held, left)
}

/// ncclCommSuspend with NCCL_SUSPEND_MEM, on a core that launched into a CUDA graph capture
/// (`graph_replays`): the core and its memory stay while a graph of either rank may hold its
/// kernels, which the ranks find out together, and go once none may; its next all-reduce then
/// goes to NCCL. Then two more communicators suspended together.
fn suspension_role(rank: usize, dir: &Path) {
    use super::super::lifecycle::{self, Lookup};
    cuda::init().unwrap();
    let device = Device::open(0).unwrap();
    device.make_current().unwrap();
    let core = plain_core(rank, dir, device, "suspension");
    let stream = OwnedStream::create(device).unwrap();
    let facts = core.facts;
    assert_eq!(graph_replays(&core, device, &stream, rank, &facts), 0);
    let comm = (0x7e59_0000 + 0x100 * rank) as crate::ffi::ncclComm_t;
    lifecycle::made(comm, true);
    assert!(lifecycle::came_on(comm, std::sync::Arc::new(core)).is_ok());
    let core_now = || match lifecycle::lookup(comm) {
        Lookup::Core(core) => core,
        _ => panic!("the core stays"),
    };
    let (held, left) = buffers_around_suspension(comm);
    println!("rank {rank}: suspended after a graph: {held} device buffers before, {left} after");
    // Nothing freed (what the agreement runs on is made at its first use, and kept).
    assert!(left >= held, "the core's buffer stays");
    drop(core_now());
    // Rank 0's graphs gone, rank 1's not: the ranks still find one, together.
    if rank == 0 {
        core_now().forget_graphs();
    }
    let core = core_now();
    let asked = core.ask_about_graphs().expect("asked");
    assert_eq!(core.graphs_answer(asked), Some(true), "rank 1's graph");
    drop(core);
    // With no graph of its kernels anywhere: the core goes, its buffer freed, and its next
    // all-reduce goes to NCCL, to set it up again after (which this test, without NCCL, fails).
    core_now().forget_graphs();
    let (held, left) = buffers_around_suspension(comm);
    println!("rank {rank}: suspended: {held} device buffers before, {left} after");
    assert!(left < held, "the core's buffer is freed");
    assert!(matches!(lifecycle::lookup(comm), Lookup::Waiting));
    let bytes = 1 << 20;
    let buffer = DeviceBuffer::alloc(device, bytes).unwrap();
    let kind = crate::ffi::OPERATIONS
        .iter()
        .position(|name| *name == "ncclAllReduce")
        .unwrap() as u8;
    let call = crate::call::Call {
        kind,
        comm,
        send: buffer.pointer as *const std::ffi::c_void,
        recv: buffer.pointer as *mut std::ffi::c_void,
        count: bytes,
        datatype: 1,
        op: Some(0),
        root: None,
        stream: stream.stream as crate::ffi::cudaStream_t,
    };
    let forwarded = super::super::operation(&call, || crate::ffi::ncclSystemError);
    assert_eq!(forwarded, crate::ffi::ncclSystemError, "forwarded");
    lifecycle::forget(comm);
    two_suspended_together(rank, dir, device);
}

/// Two more communicators' cores, suspended together, in one order on rank 0 and the other on
/// rank 1 (as two groups of different orders, or one thread driving both GPUs, would): each
/// rank starts both agreements before waiting for either, so neither waits for the other's
/// second. Both cores go.
fn two_suspended_together(rank: usize, dir: &Path, device: Device) {
    use super::super::lifecycle;
    let comms: Vec<crate::ffi::ncclComm_t> = (1..=2)
        .map(|k| (0x7e58_0000 + 0x1000 * k + 0x100 * rank) as crate::ffi::ncclComm_t)
        .collect();
    for (k, &comm) in comms.iter().enumerate() {
        let core = plain_core(rank, dir, device, &format!("more{k}-"));
        lifecycle::made(comm, true);
        assert!(lifecycle::came_on(comm, std::sync::Arc::new(core)).is_ok());
    }
    let order: Vec<_> = match rank {
        0 => comms.clone(),
        _ => comms.iter().rev().copied().collect(),
    };
    let (held, _) = cuda::live_resources();
    super::super::suspension::suspend(&order);
    let (left, _) = cuda::live_resources();
    println!("rank {rank}: two suspended together: {held} device buffers before, {left} after");
    for comm in comms {
        assert!(matches!(
            lifecycle::lookup(comm),
            lifecycle::Lookup::Waiting
        ));
        lifecycle::forget(comm);
    }
    assert!(left + 2 <= held, "both cores' buffers are freed");
}

/// An all-reduce on buffers new to the peers, captured into a CUDA graph (the offer and the
/// answers happen during the capture), replayed three times on fresh inputs; wrong bytes.
fn graph_replays(
    core: &super::super::comm::CoreComm,
    device: Device,
    stream: &OwnedStream,
    rank: usize,
    facts: &super::super::policy::CommFacts,
) -> usize {
    use super::super::policy;
    use cudarc::driver::sys;
    let bytes = 6usize << 20;
    let send = DeviceBuffer::alloc(device, bytes).unwrap();
    let recv = DeviceBuffer::alloc(device, bytes).unwrap();
    let plan = policy::plan_args(policy::settings(), AllReduce, bytes, 1, 0, -1, facts).unwrap();
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: driver calls on our own stream, graph and buffers; results checked.
    unsafe {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        assert_eq!(
            sys::cuStreamBeginCapture_v2(stream.stream, mode),
            sys::CUresult::CUDA_SUCCESS
        );
        core.launch(
            &plan,
            send.pointer as *const std::ffi::c_void,
            recv.pointer as *mut std::ffi::c_void,
            stream.stream,
        )
        .unwrap();
        assert_eq!(
            sys::cuStreamEndCapture(stream.stream, &mut graph),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            sys::CUresult::CUDA_SUCCESS
        );
    }
    let mut wrong = 0;
    for replay in 0..3u8 {
        let mine = 0x10 * (rank as u8 + 1) + replay;
        stream.fill(send.pointer, mine, bytes).unwrap();
        // SAFETY: our instantiated graph and stream.
        unsafe {
            assert_eq!(
                sys::cuGraphLaunch(exec, stream.stream),
                sys::CUresult::CUDA_SUCCESS
            )
        };
        stream.synchronize().unwrap();
        let mut got = vec![0u8; bytes];
        cuda::copy_to_host(&mut got, recv.pointer).unwrap();
        let want = 0x10u8 + 0x20 + 2 * replay;
        let bad = got.iter().filter(|&&b| b != want).count();
        println!("rank {rank} graph replay {replay}: {bytes} B: {bad} wrong");
        wrong += bad;
    }
    // SAFETY: ours, no longer used.
    unsafe {
        sys::cuGraphExecDestroy(exec);
        sys::cuGraphDestroy(graph);
    }
    wrong
}

/// Where a case puts its buffers: apart, in place (as NCCL defines it for the collective), or
/// one of them 4 bytes past a 16-byte boundary (which takes the staged path where the peers
/// touch that buffer).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    Apart,
    InPlace,
    SendOffset,
    RecvOffset,
}

/// Byte i of rank `rank`'s input, in chunk `i / chunk`.
fn input_byte(rank: usize, chunk_index: usize) -> u8 {
    0x10 + 0x20 * rank as u8 + chunk_index as u8
}

/// What byte `i` of rank `rank`'s output holds after the call (`op`: 0 sum, 2 max; the inputs
/// are bytes small enough that 32-bit integers add and compare bytewise).
fn expected_byte(
    collective: super::super::types::Collective,
    rank: usize,
    root: usize,
    chunk: usize,
    i: usize,
    layout: Layout,
    op: u32,
) -> u8 {
    use super::super::types::Collective::*;
    let reduced = |c: usize| match op {
        0 => input_byte(0, c) + input_byte(1, c),
        _ => input_byte(0, c).max(input_byte(1, c)),
    };
    let is_root = rank == root;
    match collective {
        AllReduce => reduced(0),
        AllGather => input_byte(i / chunk, 0),
        Gather if is_root => input_byte(i / chunk, 0),
        ReduceScatter => reduced(rank),
        Broadcast => input_byte(root, 0),
        Reduce if is_root => reduced(0),
        // A non-root's output is not written: in place it still holds its input.
        Reduce if layout == Layout::InPlace => input_byte(rank, 0),
        AllToAll => input_byte(i / chunk, rank),
        Scatter => input_byte(root, rank),
        Reduce | Gather => 0,
    }
}

/// Every collective but all-reduce, of bytes (reduce and reduce-scatter also of 32-bit integers,
/// summed and maxed): straight through zero-copy, and staged where a chunk's places are not
/// 16-aligned or a buffer the peer touches is misaligned; in place; each root. The settings that
/// turn them on come from the parent. Wrong bytes.
fn other_collectives(
    core: &super::super::comm::CoreComm,
    device: Device,
    stream: &OwnedStream,
    rank: usize,
    facts: &super::super::policy::CommFacts,
) -> usize {
    use super::super::policy;
    use super::super::types::Collective::{self, *};
    let mut wrong = 0;
    let mut cases: Vec<(Collective, usize, usize, Layout, u32, u32)> = Vec::new();
    for collective in [
        AllGather,
        ReduceScatter,
        Broadcast,
        Reduce,
        AllToAll,
        Gather,
        Scatter,
    ] {
        // Direct or staged; and, for those that move bytes, as packets (whole and odd chunks).
        let chunks: &[usize] = if collective.reduces() {
            &[1 << 20]
        } else {
            &[1 << 20, 4 << 10, (64 << 10) + 3]
        };
        for &chunk in chunks {
            for layout in [
                Layout::Apart,
                Layout::InPlace,
                Layout::SendOffset,
                Layout::RecvOffset,
            ] {
                for root in [0, 1] {
                    if root == 1 && !collective.rooted() {
                        continue;
                    }
                    cases.push((collective, chunk, root, layout, 1, 0));
                }
            }
        }
        // Chunks whose places are not 16-aligned, and a small call.
        cases.push((collective, (1 << 20) + 4, 1, Layout::Apart, 1, 0));
        cases.push((collective, 100, 0, Layout::Apart, 1, 0));
        if collective.reduces() {
            cases.push((collective, 1 << 20, 1, Layout::Apart, 2, 0));
            cases.push((collective, 1 << 20, 0, Layout::InPlace, 2, 2));
        }
    }
    for (collective, chunk, root, layout, dtype, op) in cases {
        let all = 2 * chunk;
        let (send_bytes, recv_bytes) = match collective {
            AllGather | Gather => (chunk, all),
            ReduceScatter | Scatter => (all, chunk),
            AllToAll => (all, all),
            _ => (chunk, chunk),
        };
        let count = chunk
            / super::super::types::DataType::from_nccl(dtype)
                .unwrap()
                .size();
        let plan = policy::plan_args(
            policy::settings(),
            collective,
            count,
            dtype,
            op,
            root as i32,
            facts,
        )
        .unwrap();
        let send = DeviceBuffer::alloc(device, send_bytes + 64).unwrap();
        let recv = DeviceBuffer::alloc(device, recv_bytes + 64).unwrap();
        stream.fill(send.pointer, 0, send_bytes + 64).unwrap();
        stream.fill(recv.pointer, 0, recv_bytes + 64).unwrap();
        let is_root = rank == root;
        // In place as NCCL defines it: the input is the rank's place in the output, or the
        // output the rank's place in the input; one buffer where both are as large.
        let (input, output) = match (layout, collective) {
            (Layout::InPlace, AllGather) => (recv.pointer + (rank * chunk) as u64, recv.pointer),
            (Layout::InPlace, Gather) if is_root => {
                (recv.pointer + (rank * chunk) as u64, recv.pointer)
            }
            (Layout::InPlace, ReduceScatter) => {
                (send.pointer, send.pointer + (rank * chunk) as u64)
            }
            (Layout::InPlace, Scatter) if is_root => {
                (send.pointer, send.pointer + (rank * chunk) as u64)
            }
            (Layout::InPlace, Broadcast | Reduce | AllToAll) => (recv.pointer, recv.pointer),
            (Layout::SendOffset, _) => (send.pointer + 4, recv.pointer),
            (Layout::RecvOffset, _) => (send.pointer, recv.pointer + 4),
            _ => (send.pointer, recv.pointer),
        };
        let host_input: Vec<u8> = (0..send_bytes)
            .map(|i| input_byte(rank, i / chunk))
            .collect();
        stream.copy_to_device(input, &host_input).unwrap();
        let got = launch_and_read(core, &plan, input, output, stream, recv_bytes);
        let bad = got
            .iter()
            .enumerate()
            .filter(|&(i, &b)| b != expected_byte(collective, rank, root, chunk, i, layout, op))
            .count();
        println!(
            "rank {rank} {collective:?} of {chunk} B a rank, type {dtype} op {op}, root {root}, {layout:?}, {}: {bad} wrong",
            plan.algorithm.name()
        );
        wrong += bad;
    }
    wrong
}

/// Calls launched several to a kernel (`launch_batch`, as a group's are): all-reduces of each
/// small-message kernel and of the direct two-shot (one of them in place), and broadcasts from
/// alternating roots (the small ones as packets, fused into one call; the large ones one after
/// the other), each call on its own buffers; twice, so that the batch's count of blocks must have
/// been put back. Wrong bytes.
fn batches(
    core: &super::super::comm::CoreComm,
    device: Device,
    stream: &OwnedStream,
    rank: usize,
    facts: &super::super::policy::CommFacts,
) -> usize {
    use super::super::comm::Launched;
    use super::super::policy::{self, MAX_BATCH};
    use super::super::types::Collective::{self, Broadcast};
    let mut wrong = 0;
    // (collective, bytes, type: 7 f32 takes the sentinel kernel, 2 i32 the low-latency one)
    let cases: [(Collective, usize, u32); 6] = [
        (Broadcast, 4 << 10, 1),
        (AllReduce, 4 << 10, 7),
        (AllReduce, 4 << 10, 2),
        (AllReduce, 1 << 20, 2),
        (AllReduce, 4 << 20, 2),
        // Past the packets (1 MiB chunks on 2 ranks, whose grids of 256 blocks share no launch).
        (Broadcast, 4 << 20, 1),
    ];
    for round in 0..2 {
        for (collective, bytes, dtype) in cases {
            let size = super::super::types::DataType::from_nccl(dtype)
                .unwrap()
                .size();
            let plans: Vec<_> = (0..MAX_BATCH)
                .map(|k| {
                    let root = (k % 2) as i32;
                    policy::plan_args(
                        policy::settings(),
                        collective,
                        bytes / size,
                        dtype,
                        0,
                        root,
                        facts,
                    )
                    .unwrap()
                })
                .collect();
            assert!(core.may_batch(&plans[0]), "{collective:?} of {bytes} B");
            let buffers: Vec<_> = (0..MAX_BATCH)
                .map(|_| {
                    let send = DeviceBuffer::alloc(device, bytes).unwrap();
                    let recv = DeviceBuffer::alloc(device, bytes).unwrap();
                    (send, recv)
                })
                .collect();
            // Small integers, the same bytes in every word: sums and copies read alike.
            let mine = |k: usize| (1 + rank + 2 * k) as u8;
            for (k, (send, recv)) in buffers.iter().enumerate() {
                stream.fill(send.pointer, mine(k), bytes).unwrap();
                stream
                    .fill(recv.pointer, if k == 1 { mine(k) } else { 0 }, bytes)
                    .unwrap();
            }
            let launched: Vec<Launched> = plans
                .iter()
                .zip(&buffers)
                .enumerate()
                .map(|(k, (plan, (send, recv)))| Launched {
                    plan,
                    // The second call in place.
                    send: if k == 1 { recv.pointer } else { send.pointer } as *const _,
                    recv: recv.pointer as *mut _,
                    stream: stream.stream,
                })
                .collect();
            core.launch_batch(&launched, stream.stream).unwrap();
            stream.synchronize().unwrap();
            for (k, (_, recv)) in buffers.iter().enumerate() {
                let want = match collective {
                    Broadcast => (1 + k % 2 + 2 * k) as u8,
                    _ => (3 + 4 * k) as u8,
                };
                let want = if dtype == 7 {
                    // f32 sum of two words of repeated bytes: compare as floats.
                    let word = |b: u8| f32::from_le_bytes([b; 4]);
                    (word((1 + 2 * k) as u8) + word((2 + 2 * k) as u8)).to_le_bytes()
                } else {
                    [want; 4]
                };
                let mut got = vec![0u8; bytes];
                cuda::copy_to_host(&mut got, recv.pointer).unwrap();
                let bad = got.chunks(4).filter(|w| *w != want).count();
                println!(
                    "rank {rank} round {round} batch of {MAX_BATCH} {collective:?} of {bytes} B type {dtype}, call {k}: {bad} wrong words"
                );
                wrong += bad;
            }
        }
    }
    wrong
}

/// Runs both roles in two processes of this test binary (`name`: the test); whether they passed.
fn two_processes(name: &str, ids: bool) -> (bool, PathBuf) {
    if let (Ok(rank), Ok(dir), Ok(processes)) = (
        std::env::var("ZERO_COPY_ROLE"),
        std::env::var("ZERO_COPY_DIR"),
        std::env::var("ZERO_COPY_IDS"),
    ) {
        let processes = processes.split(',').map(|i| i.parse().unwrap()).collect();
        let (rank, dir) = (rank.parse().unwrap(), PathBuf::from(dir));
        match name {
            "core_all_reduce_between_two_processes_through_zero_copy" => {
                core_role(rank, &dir, processes)
            }
            "core_suspension_between_two_processes" => suspension_role(rank, &dir),
            "core_epochs_far_along_between_two_processes" => {
                epochs_far_along_role(rank, &dir, processes)
            }
            "core_on_a_green_context_between_two_processes" => {
                staged_on_a_green_context(rank, &dir)
            }
            "a_peer_lets_go_of_memory_freed_between_two_processes" => {
                freed_memory_role(rank, &dir, processes)
            }
            _ => role(rank, &dir, processes, ids),
        }
        std::process::exit(0);
    }
    let pid = std::process::id() as u64;
    let dir = std::env::temp_dir().join(format!("ncclshim-zero-copy-{pid}-{ids}"));
    std::fs::create_dir_all(&dir).unwrap();
    let tag = if name.starts_with("core") {
        2 << 40
    } else if name.starts_with("a_peer") {
        3 << 40
    } else if ids {
        0
    } else {
        1 << 40
    };
    let processes = format!("{},{}", tag + (pid << 8), tag + (pid << 8) + 1);
    let children: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    &format!("{TEST}{name}"),
                    "--ignored",
                    "--nocapture",
                ])
                .env("NCCLSHIM_TRACE", dir.join("trace.%p.jsonl"))
                .env("NCCLSHIM_TRACE_TIMING", "1")
                .env("NCCLSHIM_CORE", "force")
                .env("ZERO_COPY_ROLE", rank.to_string())
                .env("ZERO_COPY_DIR", &dir)
                .env("ZERO_COPY_IDS", &processes)
                .spawn()
                .unwrap()
        })
        .collect();
    let mut passed = true;
    for mut child in children {
        passed &= child.wait().unwrap().success();
    }
    (passed, dir)
}

/// The test `name` in two processes, with buffer ids: both roles pass.
fn both_pass(name: &str) {
    let (passed, dir) = two_processes(name, true);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(passed);
}

#[test]
#[ignore = "needs a GPU"]
fn two_processes_share_buffers_and_never_a_stale_one() {
    both_pass("two_processes_share_buffers_and_never_a_stale_one");
}

/// The check above can fail: without buffer ids, the second allocation at the same address is
/// taken for the first, and rank 1 reads the first one's memory through its old mapping.
#[test]
#[ignore = "needs a GPU"]
fn without_buffer_ids_the_stale_mapping_is_read() {
    let (passed, dir) = two_processes("without_buffer_ids_the_stale_mapping_is_read", false);
    let outcome = std::fs::read_to_string(dir.join("outcome")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(passed);
    assert_eq!(outcome.trim(), "stale");
}

#[test]
#[ignore = "needs a GPU"]
fn a_peer_lets_go_of_memory_freed_between_two_processes() {
    both_pass("a_peer_lets_go_of_memory_freed_between_two_processes");
}

#[test]
#[ignore = "needs a GPU"]
fn core_suspension_between_two_processes() {
    both_pass("core_suspension_between_two_processes");
}

#[test]
#[ignore = "needs a GPU"]
fn core_epochs_far_along_between_two_processes() {
    both_pass("core_epochs_far_along_between_two_processes");
}

#[test]
#[ignore = "needs a GPU"]
fn core_on_a_green_context_between_two_processes() {
    both_pass("core_on_a_green_context_between_two_processes");
}

#[test]
#[ignore = "needs a GPU"]
fn core_all_reduce_between_two_processes_through_zero_copy() {
    let (passed, dir) = two_processes(
        "core_all_reduce_between_two_processes_through_zero_copy",
        true,
    );
    // Each rank's five routed calls, timed.
    let mut timed = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("\"path\":\"routed\"")) {
            println!("trace: {line}");
            let time = line
                .split("\"coll_exec_time_us\":")
                .nth(1)
                .unwrap_or("null");
            timed += time.starts_with(|c: char| c.is_ascii_digit()) as usize;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(passed);
    assert_eq!(timed, 10, "routed calls with a GPU time in the trace");
}
