//! What the processes of a communicator tell each other about user buffers, one datagram per
//! message: an exporter offers an allocation (its CUDA IPC handle) at a position of its table;
//! each importer answers where it mapped it (or that it could not); an exporter retires a
//! position whose allocation is gone. Fixed-size, little-endian.

use super::super::cuda::IpcHandle;

/// Bytes of one message on the wire.
pub const MESSAGE_BYTES: usize = 104;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Exporter to importers: `handle` opens the allocation of `size` bytes at `position`.
    Export,
    /// As `Export`, for a cuMem allocation passed as the file descriptor sent with the
    /// message; `handle` holds where it sits in its process (`Piece`).
    ExportFd,
    /// Importer to exporter: where it mapped `position`'s allocation (`value`, 0: it could not).
    Ack,
    /// Exporter to importers: `position`'s allocation is gone; unmap it.
    Retire,
}

/// One message. `from` is the sender's rank in the communicator `comm` (the key every rank
/// agreed on at set-up); `generation` names which allocation a position holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    pub kind: Kind,
    pub from: u32,
    pub comm: u64,
    pub position: u32,
    pub generation: u64,
    /// Export: the allocation's size; Ack: the importer's address of it.
    pub value: u64,
    pub handle: IpcHandle,
}

impl Message {
    pub fn encode(&self) -> [u8; MESSAGE_BYTES] {
        let mut bytes = [0u8; MESSAGE_BYTES];
        let kind: u32 = match self.kind {
            Kind::Export => 1,
            Kind::Ack => 2,
            Kind::Retire => 3,
            Kind::ExportFd => 4,
        };
        bytes[0..4].copy_from_slice(&kind.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.from.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.comm.to_le_bytes());
        bytes[16..20].copy_from_slice(&self.position.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.generation.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.value.to_le_bytes());
        bytes[40..104].copy_from_slice(&self.handle);
        bytes
    }

    /// `None` for anything that is not a whole message of a known kind.
    pub fn decode(bytes: &[u8]) -> Option<Message> {
        if bytes.len() != MESSAGE_BYTES {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        let kind = match u32_at(0) {
            1 => Kind::Export,
            2 => Kind::Ack,
            3 => Kind::Retire,
            4 => Kind::ExportFd,
            _ => return None,
        };
        Some(Message {
            kind,
            from: u32_at(4),
            comm: u64_at(8),
            position: u32_at(16),
            generation: u64_at(24),
            value: u64_at(32),
            handle: bytes[40..104].try_into().unwrap(),
        })
    }
}

/// Where a cuMem allocation sits in its process: its reservation (start, size), which it may
/// share with others side by side (PyTorch's expandable segments), its base there and the
/// driver's id for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Piece {
    pub reservation: (u64, u64),
    pub base: u64,
    pub id: u64,
}

impl Piece {
    /// In the bytes of an `ExportFd` message's handle, which no IPC handle uses.
    pub fn to_handle(self) -> IpcHandle {
        let mut handle = [0u8; 64];
        let fields = [self.reservation.0, self.reservation.1, self.base, self.id];
        for (k, field) in fields.into_iter().enumerate() {
            handle[8 * k..8 * k + 8].copy_from_slice(&field.to_le_bytes());
        }
        handle
    }

    pub fn from_handle(handle: &IpcHandle) -> Piece {
        let at = |k: usize| u64::from_le_bytes(handle[8 * k..8 * k + 8].try_into().unwrap());
        Piece {
            reservation: (at(0), at(1)),
            base: at(2),
            id: at(3),
        }
    }

    /// Its offset in its reservation, if it lies within it.
    pub fn offset(&self) -> Option<u64> {
        let (start, size) = self.reservation;
        let offset = self.base.checked_sub(start)?;
        (offset < size).then_some(offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_cross_the_wire_unchanged() {
        let mut handle = [0u8; 64];
        handle
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        for kind in [Kind::Export, Kind::Ack, Kind::Retire, Kind::ExportFd] {
            let message = Message {
                kind,
                from: 3,
                comm: 0x0123_4567_89ab_cdef,
                position: 255,
                generation: 1 << 40,
                value: 0x7f00_dead_0000,
                handle,
            };
            assert_eq!(Message::decode(&message.encode()), Some(message));
        }
    }

    #[test]
    fn a_piece_rides_in_the_handle() {
        let piece = Piece {
            reservation: (0x7f00_0000_0000, 90 << 30),
            base: 0x7f00_0140_0000,
            id: 12345,
        };
        assert_eq!(Piece::from_handle(&piece.to_handle()), piece);
        assert_eq!(piece.offset(), Some(0x140_0000));
        let outside = Piece {
            base: 0x7e00_0000_0000,
            ..piece
        };
        assert_eq!(outside.offset(), None);
    }

    #[test]
    fn anything_else_is_refused() {
        assert_eq!(Message::decode(&[0u8; MESSAGE_BYTES]), None);
        assert_eq!(Message::decode(&[1u8; MESSAGE_BYTES - 1]), None);
    }
}
