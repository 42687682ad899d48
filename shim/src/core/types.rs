//! NCCL's element types, reduction operations, the collectives the core takes and our
//! algorithms, as the core names them.

/// The collectives the core can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    /// `count` elements from every rank, gathered in rank order on every rank.
    AllGather,
    /// `count` elements to every rank: its chunk of the ranks' inputs, reduced.
    ReduceScatter,
}

/// The algorithms of `all_reduce.cu`.
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
}

impl Algorithm {
    pub const ALL: [Algorithm; 7] = [
        Algorithm::LowLatency,
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::Direct,
        Algorithm::Sentinel,
        Algorithm::AllGather,
        Algorithm::ReduceScatter,
    ];

    /// Whether `all_reduce.cu` has this algorithm's kernels for `dtype`.
    pub fn supports(self, dtype: DataType) -> bool {
        match self {
            Algorithm::Sentinel => dtype.is_float(),
            Algorithm::AllGather => dtype == DataType::Uint8,
            _ => true,
        }
    }

    /// Grids sized to what the GPU holds at once: the two-shot family, whose blocks wait on
    /// each other between windows, and the all-gather and reduce-scatter ones, as large.
    pub fn needs_resident_grid(self) -> bool {
        matches!(
            self,
            Algorithm::TwoShot
                | Algorithm::Direct
                | Algorithm::AllGather
                | Algorithm::ReduceScatter
        )
    }

    /// Whether its kernel takes every rank's buffers (`Views`): straight where it can.
    pub fn reads_views(self) -> bool {
        matches!(
            self,
            Algorithm::Direct | Algorithm::AllGather | Algorithm::ReduceScatter
        )
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

    /// The suffix of this type's kernels in `all_reduce.cu`.
    pub fn kernel_suffix(self) -> &'static str {
        [
            "i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16", "e4m3", "e5m2",
        ][self as usize]
    }

    /// The type's name in `all_reduce.cu`.
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
        assert!(!Algorithm::Sentinel.supports(DataType::Int32));
        assert!(Algorithm::Sentinel.supports(DataType::Float64));
        assert!(Algorithm::LowLatency.supports(DataType::Uint8));
    }
}
