//! NCCL's element types, reduction operations, the collectives the core takes (one table of
//! what it knows of each) and our algorithms, as the core names them.

/// The collectives the core can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    /// `count` elements from every rank, gathered in rank order on every rank.
    AllGather,
    /// `count` elements to every rank: its chunk of the ranks' inputs, reduced.
    ReduceScatter,
    /// `count` elements of the root's input to every rank.
    Broadcast,
    /// `count` elements of every rank's input, reduced into the root's output.
    Reduce,
    /// `count` elements from every rank to every rank: chunk p of each input to rank p.
    AllToAll,
    /// `count` elements from every rank, gathered in rank order on the root.
    Gather,
    /// `count` elements to every rank: its chunk of the root's input.
    Scatter,
}

impl Collective {
    pub const ALL: [Collective; 8] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::Gather,
        Collective::Scatter,
    ];

    /// What the core knows of the collective: its row of `COLLECTIVES`.
    const fn facts(self) -> &'static CollectiveFacts {
        &COLLECTIVES[self as usize]
    }

    /// The bytes of a call whose `count` (as the API takes it) is `chunk` bytes, as nccl-tests
    /// counts them: every rank's chunks together, or the one buffer of a broadcast or reduce.
    pub fn size(self, chunk: usize, nranks: usize) -> usize {
        match self.facts().chunk_per_rank {
            true => chunk.saturating_mul(nranks),
            false => chunk,
        }
    }

    /// Its name in settings (`NCCLSHIM_MAX_BYTES=all_gather:128K`), in upper case.
    pub fn variable_name(self) -> &'static str {
        self.facts().variable
    }

    /// Whether the collective has a root.
    pub fn rooted(self) -> bool {
        self.facts().rooted
    }

    /// Whether it reduces (takes an op); the others move bytes.
    pub fn reduces(self) -> bool {
        self.facts().reduces
    }

    /// Whether NCCL (2.28 on) may move it with the GPU's copy engines, where asked and its
    /// buffers lie in symmetric windows (ce_coll.cc, `ncclCeImplemented`).
    pub fn nccl_may_use_copy_engines(self) -> bool {
        matches!(
            self,
            Collective::AllGather | Collective::AllToAll | Collective::Gather | Collective::Scatter
        )
    }

    /// Whether a rank reads its input: all but the non-roots of a broadcast and a scatter, whose
    /// send buffers NCCL ignores.
    pub fn reads_input(self, is_root: bool) -> bool {
        is_root || self.facts().every_rank_reads
    }

    /// Whether a rank writes its output: all but the non-roots of a reduce and a gather.
    pub fn writes_output(self, is_root: bool) -> bool {
        is_root || self.facts().every_rank_writes
    }

    pub fn name(self) -> &'static str {
        self.facts().name
    }

    /// What the peers touch of a rank's input and output in its direct kernel (`Span`).
    pub fn peers_touch(self) -> (Span, Span) {
        self.facts().peers_touch
    }

    /// Whether its direct kernel needs the places of the ranks' chunks 16-aligned.
    pub fn needs_aligned_places(self) -> bool {
        self.facts().aligned_places
    }

    /// The collective whose own kernel (not its packet kernel) `algorithm` is.
    pub fn with_kernel(algorithm: Algorithm) -> Option<Collective> {
        Collective::ALL
            .into_iter()
            .find(|c| c.facts().kernel == Some(algorithm))
    }

    /// The NCCL functions whose calls are this collective's.
    pub const fn functions(self) -> &'static [&'static str] {
        self.facts().functions
    }
}

/// One row of the table of collectives.
struct CollectiveFacts {
    name: &'static str,
    /// Its part of the names of its settings.
    variable: &'static str,
    /// The NCCL functions that call it (not their variants the core has not weighed, such as
    /// 2.30's `ncclAllReduceConfig`: those forward).
    functions: &'static [&'static str],
    rooted: bool,
    reduces: bool,
    /// Its `count` is one rank's chunk of a buffer of every rank's (`Collective::size`).
    chunk_per_rank: bool,
    /// Every rank reads its send buffer (else only the root).
    every_rank_reads: bool,
    /// Every rank writes its receive buffer (else only the root).
    every_rank_writes: bool,
    /// Its own kernel (all-reduce's are chosen by size: `policy::plan_all_reduce`).
    kernel: Option<Algorithm>,
    /// Its packet kernel for small chunks, where it has one.
    low_latency_kernel: Option<Algorithm>,
    /// What the peers read of a rank's input and write of its output in its own kernel where
    /// they reach the ranks' buffers (direct).
    peers_touch: (Span, Span),
    /// That kernel needs the places where the ranks' chunks start in a buffer 16-aligned.
    aligned_places: bool,
}

/// How much of a rank's buffer its peers touch in a collective's direct kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    Nothing,
    /// One chunk (`count` elements).
    Chunk,
    /// Every rank's chunk.
    AllChunks,
    /// One chunk on the root, nothing elsewhere.
    ChunkAtRoot,
    /// Every rank's chunk on the root, nothing elsewhere.
    AllChunksAtRoot,
}

impl Span {
    pub fn bytes(self, chunk: u64, nranks: usize, is_root: bool) -> u64 {
        match self {
            Span::Nothing => 0,
            Span::Chunk => chunk,
            Span::AllChunks => chunk * nranks as u64,
            Span::ChunkAtRoot if is_root => chunk,
            Span::AllChunksAtRoot if is_root => chunk * nranks as u64,
            Span::ChunkAtRoot | Span::AllChunksAtRoot => 0,
        }
    }
}

/// The collectives the core has, in the order of `Collective`. A collective the core gains is a
/// row here and its `Algorithm`s, its kernel (device/: a row of `route` in device.cuh where it
/// moves data as the others do) and its line in device/entry.cu.
#[rustfmt::skip]
const COLLECTIVES: [CollectiveFacts; Collective::ALL.len()] = {
    use Algorithm::*;
    const fn row(
        (name, variable): (&'static str, &'static str),
        functions: &'static [&'static str],
        [rooted, reduces, chunk_per_rank, every_rank_reads, every_rank_writes]: [bool; 5],
        (kernel, low_latency_kernel): (Option<Algorithm>, Option<Algorithm>),
        (peers_touch, aligned_places): ((Span, Span), bool),
    ) -> CollectiveFacts {
        CollectiveFacts {
            name, variable, functions, rooted, reduces, chunk_per_rank, every_rank_reads,
            every_rank_writes, kernel, low_latency_kernel, peers_touch, aligned_places,
        }
    }
    use Span::*;
    const N: bool = false;
    const Y: bool = true;
    [
        // name, setting; the functions that call it; rooted, reduces, chunk per rank, every
        // rank reads, every rank writes; its kernel and packet kernel; what peers touch of a
        // rank's input and output in it, aligned places.
        row(("all-reduce", "ALL_REDUCE"),         &["ncclAllReduce"],              [N, Y, N, Y, Y],
            (None, None),                            ((Chunk, Chunk), N)),
        row(("all-gather", "ALL_GATHER"),         &["ncclAllGather"],              [N, N, Y, Y, Y],
            (Some(AllGather), Some(LlAllGather)),    ((Nothing, AllChunks), Y)),
        row(("reduce-scatter", "REDUCE_SCATTER"), &["ncclReduceScatter"],          [N, Y, Y, Y, Y],
            (Some(ReduceScatter), Some(LlReduce)),   ((AllChunks, Nothing), Y)),
        row(("broadcast", "BROADCAST"),           &["ncclBroadcast", "ncclBcast"], [Y, N, N, N, Y],
            (Some(Broadcast), Some(LlBroadcast)),    ((Nothing, Chunk), N)),
        row(("reduce", "REDUCE"),                 &["ncclReduce"],                 [Y, Y, N, Y, N],
            (Some(Reduce), Some(LlReduce)),          ((Chunk, ChunkAtRoot), N)),
        row(("all-to-all", "ALL_TO_ALL"),         &["ncclAlltoAll"],               [N, N, Y, Y, Y],
            (Some(AllToAll), Some(LlAllToAll)),      ((Nothing, AllChunks), Y)),
        row(("gather", "GATHER"),                 &["ncclGather"],                 [Y, N, Y, Y, N],
            (Some(Gather), Some(LlGather)),          ((Nothing, AllChunksAtRoot), Y)),
        row(("scatter", "SCATTER"),               &["ncclScatter"],                [Y, N, Y, N, Y],
            (Some(Scatter), Some(LlScatter)),        ((Nothing, Chunk), N)),
    ]
};

/// The algorithms of the kernels (`device/`): all-reduce's, then one per other collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Every rank writes its input into every rank's inbox as flagged packets: no barrier, for
    /// the smallest messages of types the sentinel kernel lacks.
    LowLatency = 0,
    /// Every rank reads every peer's staged data and reduces it all: one barrier.
    OneShot = 1,
    /// Reduce-scatter then all-gather through the peers' buffers: two barriers, for larger ones.
    TwoShot = 2,
    /// Two-shot straight from the inputs into the outputs, for ranks of one process: one
    /// barrier, no staging (the staged two-shot where a rank's buffers cannot be reached).
    Direct = 3,
    /// Low latency without flags: every rank writes its input into every rank's inbox, where
    /// a value that no sender writes (a NaN) marks what has not arrived. Floating-point types.
    Sentinel = 4,
    /// All-gather: every rank pushes its input into every rank's output (straight where every
    /// rank's buffers can be reached, else through the peers' staging). Bytes (`Uint8`) only.
    AllGather = 5,
    /// Reduce-scatter: every rank reduces its chunk of every rank's input (straight, or pushed
    /// into its staging by the peers).
    ReduceScatter = 6,
    /// Broadcast: the root pushes its input into every rank's output (or staging). Bytes.
    Broadcast = 7,
    /// Reduce: each rank reduces its share of every input into the root's output (or the root
    /// reduces what every rank pushed into its staging).
    Reduce = 8,
    /// All-to-all: every rank pushes each chunk of its input into its rank's output (or
    /// staging). Bytes.
    AllToAll = 9,
    /// Gather: every rank pushes its input into the root's output (or staging). Bytes.
    Gather = 10,
    /// Scatter: the root pushes each chunk of its input into its rank's output (or staging).
    /// Bytes.
    Scatter = 11,
    /// Low latency (small messages): every chunk goes straight into its receiver's inbox as
    /// flagged packets, one trip, no barrier; one kernel per collective that moves bytes.
    LlAllGather = 12,
    LlBroadcast = 13,
    LlAllToAll = 14,
    LlGather = 15,
    LlScatter = 16,
    /// Low latency for reduce-scatter and reduce: every chunk goes as packets to the rank that
    /// reduces it (one kernel for both: a root below 0 is a reduce-scatter).
    LlReduce = 17,
}

impl Algorithm {
    pub const ALL: [Algorithm; 18] = [
        Algorithm::LowLatency,
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::Direct,
        Algorithm::Sentinel,
        Algorithm::AllGather,
        Algorithm::ReduceScatter,
        Algorithm::Broadcast,
        Algorithm::Reduce,
        Algorithm::AllToAll,
        Algorithm::Gather,
        Algorithm::Scatter,
        Algorithm::LlAllGather,
        Algorithm::LlBroadcast,
        Algorithm::LlAllToAll,
        Algorithm::LlGather,
        Algorithm::LlScatter,
        Algorithm::LlReduce,
    ];

    /// The algorithm of one of the collectives that have one each (not all-reduce).
    pub fn of(collective: Collective) -> Option<Algorithm> {
        collective.facts().kernel
    }

    /// The packet kernel of a collective other than all-reduce, where it has one.
    pub fn low_latency_of(collective: Collective) -> Option<Algorithm> {
        collective.facts().low_latency_kernel
    }

    /// Whether it reduces; the others move bytes, with one kernel (`u8`, `sum`).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Algorithm::LowLatency
                | Algorithm::OneShot
                | Algorithm::TwoShot
                | Algorithm::Direct
                | Algorithm::Sentinel
                | Algorithm::ReduceScatter
                | Algorithm::Reduce
                | Algorithm::LlReduce
        )
    }

    /// Whether it is one of all-reduce's.
    pub fn is_all_reduce(self) -> bool {
        Collective::with_kernel(self).is_none() && !self.is_packet_kernel()
    }

    /// Whether it is the packet kernel of a collective other than all-reduce.
    pub fn is_packet_kernel(self) -> bool {
        matches!(
            self,
            Algorithm::LlAllGather
                | Algorithm::LlBroadcast
                | Algorithm::LlAllToAll
                | Algorithm::LlGather
                | Algorithm::LlScatter
                | Algorithm::LlReduce
        )
    }

    /// The bytes a call takes in the inboxes of a fused launch, where its kernel runs a launch's
    /// calls as one (device.cuh, "fused launches"): its own (`bytes`: the chunk each rank sends
    /// another, for the other collectives' packet kernels), in whole units (8 bytes for the
    /// low-latency kernels, 16 for the sentinel one). `None`: the kernel runs them one after the
    /// other.
    pub fn fused_bytes(self, bytes: usize) -> Option<usize> {
        match self {
            Algorithm::LowLatency => Some(bytes.div_ceil(8) * 8),
            Algorithm::Sentinel => Some(bytes.div_ceil(16) * 16),
            _ if self.is_packet_kernel() => Some(bytes.div_ceil(8) * 8),
            _ => None,
        }
    }

    /// Whether the kernels have this algorithm for `dtype` and `op`.
    pub fn supports(self, dtype: DataType, op: Op) -> bool {
        match self {
            Algorithm::Sentinel => dtype.is_float(),
            _ if !self.reduces() => dtype == DataType::Uint8 && op == Op::Sum,
            _ => true,
        }
    }

    /// Grids sized to what the GPU holds at once: all but the small-message kernels. The
    /// two-shot family's blocks wait on each other between windows, and every block of the
    /// others waits for its namesake on every peer, which must be running too.
    pub fn needs_resident_grid(self) -> bool {
        !matches!(
            self,
            Algorithm::LowLatency | Algorithm::OneShot | Algorithm::Sentinel
        ) && !self.is_packet_kernel()
    }

    /// Whether its kernel takes every rank's buffers (`Views`): straight where it can.
    pub fn reads_views(self) -> bool {
        !matches!(
            self,
            Algorithm::LowLatency | Algorithm::OneShot | Algorithm::TwoShot | Algorithm::Sentinel
        ) && !self.is_packet_kernel()
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::LowLatency => "ll",
            Algorithm::OneShot => "one_shot",
            Algorithm::TwoShot => "two_shot",
            Algorithm::Direct => "direct",
            Algorithm::Sentinel => "sentinel",
            Algorithm::AllGather => "all_gather",
            Algorithm::ReduceScatter => "reduce_scatter",
            Algorithm::Broadcast => "broadcast",
            Algorithm::Reduce => "reduce",
            Algorithm::AllToAll => "all_to_all",
            Algorithm::Gather => "gather",
            Algorithm::Scatter => "scatter",
            Algorithm::LlAllGather => "ll_all_gather",
            Algorithm::LlBroadcast => "ll_broadcast",
            Algorithm::LlAllToAll => "ll_all_to_all",
            Algorithm::LlGather => "ll_gather",
            Algorithm::LlScatter => "ll_scatter",
            Algorithm::LlReduce => "ll_reduce",
        }
    }
}

/// `ncclDataType_t`, in NCCL's numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
    Float8e4m3 = 10,
    Float8e5m2 = 11,
}

impl DataType {
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    /// From NCCL's value; `None` for anything else (the real NCCL then judges it).
    pub fn from_nccl(value: u32) -> Option<DataType> {
        DataType::ALL.get(value as usize).copied()
    }

    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8e4m3 | DataType::Float8e5m2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Bfloat16
                | DataType::Float8e4m3
                | DataType::Float8e5m2
        )
    }

    /// The suffix of this type's kernels.
    pub fn kernel_suffix(self) -> &'static str {
        [
            "i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16", "e4m3", "e5m2",
        ][self as usize]
    }

    /// The type's name in the kernels' source.
    pub fn cuda_type(self) -> &'static str {
        [
            "signed char",
            "unsigned char",
            "int",
            "u32",
            "long long",
            "u64",
            "f16",
            "float",
            "double",
            "bf16",
            "e4m3",
            "e5m2",
        ][self as usize]
    }
}

/// The built-in `ncclRedOp_t`s; PreMulSum (made by ncclRedOpCreatePreMulSum) stays with NCCL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
}

impl Op {
    pub const ALL: [Op; 5] = [Op::Sum, Op::Prod, Op::Max, Op::Min, Op::Avg];

    pub fn from_nccl(value: u32) -> Option<Op> {
        Op::ALL.get(value as usize).copied()
    }

    pub fn name(self) -> &'static str {
        ["sum", "prod", "max", "min", "avg"][self as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of collectives holds together: what it says of each agrees with the rest.
    #[test]
    fn the_table_of_collectives_is_consistent() {
        for c in Collective::ALL {
            assert!(
                c.reads_input(true) && c.writes_output(true),
                "{c:?}: the root does both"
            );
            assert_eq!(
                c.rooted(),
                !(c.reads_input(false) && c.writes_output(false)),
                "{c:?}: only a rooted collective leaves a buffer of its non-roots alone"
            );
            assert!(!c.functions().is_empty(), "{c:?}: no function calls it");
            assert_eq!(Algorithm::of(c).is_none(), c == Collective::AllReduce);
            if let Some(ll) = Algorithm::low_latency_of(c) {
                assert_eq!(ll.reduces(), c.reduces(), "{c:?}: its packet kernel");
                assert!(ll.is_packet_kernel() && !ll.needs_resident_grid(), "{c:?}");
                assert!(!ll.is_all_reduce(), "{c:?}");
            }
            if let Some(kernel) = Algorithm::of(c) {
                assert_eq!(kernel.reduces(), c.reduces(), "{c:?}");
                assert!(!kernel.is_all_reduce(), "{c:?}");
            }
            // As nccl-tests counts bytes: one buffer of a broadcast or reduce, all ranks' chunks
            // of the others.
            let one_buffer = matches!(
                c,
                Collective::AllReduce | Collective::Broadcast | Collective::Reduce
            );
            assert_eq!(c.size(4, 8), if one_buffer { 4 } else { 32 }, "{c:?}");
        }
        let names: Vec<&str> = Collective::ALL
            .iter()
            .flat_map(|c| c.functions())
            .copied()
            .collect();
        let all_reduce = Algorithm::ALL.into_iter().filter(|a| a.is_all_reduce());
        assert_eq!(
            all_reduce.count(),
            5,
            "low-latency, one-shot, two-shot, direct, sentinel"
        );
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "a function calls one collective");
    }

    #[test]
    fn nccl_values_map_both_ways() {
        for (i, t) in DataType::ALL.iter().enumerate() {
            assert_eq!(DataType::from_nccl(i as u32), Some(*t));
        }
        assert_eq!(DataType::from_nccl(12), None);
        assert_eq!(Op::from_nccl(4), Some(Op::Avg));
        assert_eq!(Op::from_nccl(5), None, "PreMulSum ops start at ncclNumOps");
        assert_eq!(DataType::Bfloat16.size(), 2);
        assert_eq!(DataType::Float8e5m2.kernel_suffix(), "e5m2");
        let floats: Vec<_> = DataType::ALL.into_iter().filter(|t| t.is_float()).collect();
        assert_eq!(
            floats.len(),
            6,
            "half, float, double, bfloat16 and both fp8"
        );
        assert!(!Algorithm::Sentinel.supports(DataType::Int32, Op::Sum));
        assert!(Algorithm::Sentinel.supports(DataType::Float64, Op::Max));
        assert!(Algorithm::LowLatency.supports(DataType::Uint8, Op::Avg));
        assert!(Algorithm::Reduce.supports(DataType::Bfloat16, Op::Min));
        assert!(Algorithm::Broadcast.supports(DataType::Uint8, Op::Sum));
        assert!(!Algorithm::Broadcast.supports(DataType::Uint8, Op::Max));
        assert!(!Algorithm::Gather.supports(DataType::Float32, Op::Sum));
        assert!(Algorithm::LlGather.supports(DataType::Uint8, Op::Sum));
        assert!(!Algorithm::LlGather.needs_resident_grid() && !Algorithm::LlGather.reads_views());
        assert!(Algorithm::Gather.needs_resident_grid() && Algorithm::Gather.reads_views());
    }
}
