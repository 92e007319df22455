// Package raftlog is the node log: one node-wide, segmented, checksummed
// journal that stores the Raft log entries and stable-store values of every
// Raft group on the node, so that hundreds of groups share one file sequence
// and one fsync stream.
//
// Each group gets a GroupStore (Log.Group), which implements hashicorp/raft's
// LogStore, StableStore and MonotonicLogStore.
//
// # Writing
//
// Every mutation (StoreLogs, DeleteRange, Set) is encoded in the caller's
// goroutine and queued for a single flusher goroutine. The flusher takes all
// queued requests of all groups, writes them with one write(2), fsyncs once
// if any of them needs it, applies them to the in-memory indexes in file
// order and only then returns to the callers (group commit). A caller
// that finds the journal idle (no write under way, nothing queued) does
// the flusher's work itself instead of waking it. When a write of the last
// 10 ms had company (more than one request, or requests queued during it),
// it first yields the processor once, so that goroutines already runnable
// queue their requests, and writes its own and theirs in one batch. With
// FsyncNever an append is acknowledged from the page cache (it survives
// kill -9, not a host crash); with FsyncAlways after fsync. Stable-store
// writes (terms, votes) are fsynced in both modes. Under FsyncNever the
// flusher starts the kernel's write-back every 4 MiB (sync_file_range on
// Linux), so sealing a segment does not stall writers behind 64 MiB of dirty
// pages. A write or fsync error is
// sticky: every later call fails (retrying fsync is not safe), except
// stable-store writes (see Full disk and failing writes); the next Open
// keeps the verified prefix.
//
// In memory, each group keeps a dense slice of 12-byte locations (segment,
// offset, length) indexed by raft index; GetLog preads the entry. Entries are
// not cached; wrap a GroupStore in raft.NewLogCache for that. GetLog checks
// the entry's index but not the record checksum (verified at Open), so a
// bit flip on disk after Open is only caught by the next Open. GetLogMeta
// reads only an entry's fixed part (index, term, type, time; no body) and
// EntrySizes gives every live entry's size from the index without I/O, so a
// restart need not read every body before the state machine replays it. Limits: one
// entry up to 256 MiB, SegmentBytes 4 KiB..1 GiB, segment ids below 2^32.
//
// Close drains the queue, appends a shutdown record and fsyncs, so after a
// clean shutdown nothing is lost even with FsyncNever.
//
// # Files
//
// dir/LOCK is held with flock while the journal is open. Segments are
// dir/NNNNNNNNNNNNNNNNNNNN.seg (20-digit decimal id, starting at 1, no gaps).
// dir/reserve (4 MiB of zeros) and dir/stable (the stable side file, two
// slots of 1 MiB) sit beside them (see Full disk and failing writes), and
// under FsyncAlways dir/prealloc.tmp, the next segment being prepared (see
// Prepared segments).
// All integers are little-endian unless stated.
//
// Segment header, 32 bytes:
//
//	0  magic "UNODELOG"
//	8  format version u32 (1; any other version refuses to open)
//	12 reserved u32 (0)
//	16 segment id u64 (must match the file name)
//	24 reserved u32 (0)
//	28 crc32c (Castagnoli) of bytes 0..28
//
// The header is followed by frames, back to back:
//
//	0  header crc u32: crc32c of frame bytes 4..24, then segment id u64 and
//	   the frame's offset u64. Binding the position means a damaged length,
//	   or a stale frame seen at another offset, never verifies.
//	4  magic "NL"
//	6  record type u8
//	7  flags u8: 0x01 = every byte before this frame was fsynced when
//	   it was written; other bits must be 0
//	8  payload length u32
//	12 group id u64
//	20 payload crc32c u32
//	24 payload
//
// Record types and payloads:
//
//	1 entries: count u32, then count entries with consecutive indexes:
//	  index u64, term u64, type u8, appended-at unix seconds i64,
//	  appended-at nanoseconds u32, data length u32, extensions length u32,
//	  data, extensions. A length of exactly 1<<31 marks a nil field (as
//	  opposed to an empty one). A StoreLogs batch is one record, or a run
//	  of records cut at about 1 MiB. Storing an index at or below the last
//	  one replaces that index and everything after it; storing past a gap,
//	  or at or below the first index, starts the group's log anew there.
//	2 delete range: min u64, max u64 (inclusive; a prefix, a suffix or all).
//	3 stable: count u32, then count times key length u32, key, value length
//	  u32, value. SetUint64 values are 8 bytes big-endian.
//	4 shutdown: empty, group 0. Close writes it last; Open reports whether
//	  the journal ends with it (Stats.CleanShutdown), which tells an engine
//	  whether the previous process may have lost unsynced appends.
//
// AppendedAt comes back in UTC without a monotonic reading (time.Equal to
// what was stored).
//
// # Segments and purge
//
// The active segment is sealed (fsynced) once the next frame would take it
// past Options.SegmentBytes; then the next segment is created with its
// header followed by a checkpoint: one stable record per group holding all
// of that group's stable values. Header and checkpoint are fsynced, and the
// directory too, before anything else goes into the new segment. Because of
// the checkpoint, stable values never pin old segments: a segment is deleted
// as soon as it is not the active one and no group's oldest live entry is in
// it or before it, once everything written is synced, so the record that
// made a segment dead is durable before the file goes (the flusher syncs
// for it in either mode; this happens on compaction, when a group's oldest
// entry moves to a later segment, not per append). The unlink and
// directory sync run in a background goroutine, oldest first. Only the
// oldest segments are deleted, so the remaining sequence is always
// contiguous, and replaying it yields for every group a contiguous suffix of
// its history.
//
// A group that rarely reaches raft's snapshot threshold would pin the oldest
// segment forever. So after each roll, if every group holding entries in
// the oldest segment is small (live entries up to SegmentBytes/16, a quarter
// segment in all), their live entries are copied into the active segment as
// ordinary entries records (a record that starts at or below a group's first
// index replaces its log), fsynced in either mode, and the old segment is
// purged. A big group that does not compact still pins it
// (Stats.OldestSegmentPinnedBy names one).
//
// Compaction also releases the active segment: when a prefix delete leaves
// every live entry in the active segment, taking at most a quarter of it
// (and each group at most SegmentBytes/16), and the segment holds at least
// 1 MiB, the flusher seals it at once, copies the live entries forward and
// purges it. So once raft compacts a group whose data reached the cold tier,
// the disk space comes back within the same write, not when the segment
// fills.
//
// # Prepared segments (FsyncAlways)
//
// An fsync after a write that extends a file must also commit its new size
// and block allocation (an ext4 journal commit); after a write into blocks
// already written it flushes only the data. A 4 KiB write and fsync took
// 213-244 us extending a file and 114-160 us inside a file already written
// with zeros on the test VMs (fallocate alone does not help: its blocks are
// "unwritten", and the first write into them is a metadata change too). So
// with FsyncAlways a background goroutine writes the next segment full of
// zeros as dir/prealloc.tmp while the active one fills (each 1 MiB chunk is
// written back and waited for before the next, so the zeros never queue up
// ahead of the journal's fsyncs), and syncs it. The roll writes the header
// and checkpoint into it, syncs it, renames it to its segment name and
// syncs the directory: a crash leaves either no new segment or one with a
// valid header. The sealed segment is truncated to its last frame before its
// sealing fsync, so sealed segments never end in zeros. Open deletes a
// leftover prealloc.tmp. The segment active at Open, when it is not a
// prepared one (a new journal's first), is sealed as soon as a prepared one
// is ready, so a node writing little gets the faster fsyncs without
// filling a segment first. FsyncNever prepares nothing: it has no fsync to
// speed up, and the zeros would double the bytes the disk writes. The cost
// under FsyncAlways is one segment of disk (64 MiB by default) held ahead,
// and one more write of each segment's bytes; under disk pressure (the
// DiskGuard refusing writes) no preparation starts.
//
// # Recovery
//
// Open replays every segment in order, verifying every frame, and rebuilds
// the indexes and stable values through the same apply function the live
// path uses. What is done with damage depends on where it is:
//
//   - A sealed segment (not the last) was fsynced before its successor was
//     created, so any damage there is a disk fault, not an interrupted
//     write: Open refuses with ErrCorrupt. So does a missing segment id.
//   - In the last segment, damage with no valid frame after it is a torn or
//     unfinished tail, never acknowledged as durable: it is cut (truncate +
//     fsync) and reported through Logf and Stats (TailDamage "torn" for an
//     incomplete final frame, "corrupt" for a complete frame that failed
//     verification, and TruncatedBytes). An engine can use TailDamage to
//     hold its groups back until a leader confirms them.
//   - In the last segment, nothing but zeros after the last valid frame is
//     room, not damage: a prepared segment (see Prepared segments), or blocks
//     a crash allocated before their data reached them. Nothing is cut; appends
//     continue where the frames end.
//   - Damage in the last segment followed by valid frames: the flusher
//     sets flag 0x01 on the first frame of a write when every byte before it
//     had been fsynced. If such a frame follows the damage, synced
//     (acknowledged) data was hit: Open refuses (ErrCorrupt) in either mode.
//     Otherwise all of it was written after the last fsync, and a host crash
//     may have persisted later pages of a write but not earlier ones: the
//     damaged region and everything after it is cut and logged.
//   - A segment of an unknown format version is a *VersionError.
//   - The stable side file's newest valid slot is applied where the replay
//     reaches its journal position (before the first frame at or after it),
//     or at the end; see below. A torn slot is ignored (the other slot held
//     the newest state while it was written); both slots damaged is
//     ErrCorrupt.
//
// # Full disk and failing writes
//
// A batch that meets ENOSPC is cut from the segment and refused, nothing of
// it applied, and the journal stays usable; Options.Guard (DiskGuard) learns
// of it and refuses client writes until space returns. The first ENOSPC
// deletes dir/reserve and retries the batch once, so a vote, a term or a
// leader's entries still find room; the reserve is written again once the
// guard sees space. Any other write or fsync error fails the journal for
// good.
//
// hashicorp/raft panics when it cannot save its current term, so Set and
// SetUint64 never fail because of the journal's disk. A stable write the
// journal could not take (ENOSPC with the reserve gone, EIO, a failed
// journal) is written to dir/stable instead: a file created at full size
// when the journal opens (while there is room) and afterwards only
// overwritten in place, so writing it needs no new block. It has two slots;
// each write holds the stable values of every group, with the new pairs
// applied, and goes to the slot that does not hold the newest valid state,
// then fsync. Slot layout:
//
//	0  magic "USTABLE1"
//	8  generation u64 (the newer valid slot wins)
//	16 journal segment id u64 \ the end of the journal
//	24 journal offset u64     / when the slot was written
//	32 payload length u32
//	36 crc32c of bytes 0..36 and the payload
//	40 payload: group count u32, then per group (ascending id): group id
//	   u64, stable payload length u32, stable payload (as in record 3)
//
// Journal records before the slot's position are older than the slot,
// records at or after it newer, which is how recovery orders them. If Open
// finds the journal ending before a slot's position (a cut tail), it writes
// the current state to the side file at the journal's end first, so records
// written from then on count as newer. If the side file fails too, Set
// retries every 200 ms until it succeeds or the journal closes (ErrClosed):
// raft's goroutine for that group blocks, and the group's other voters elect
// a leader meanwhile. The slot bounds the stable values of all groups
// together at 1 MiB (about 10,000 groups). Stats.SideWrites counts side
// writes, Stats.StableSideApplied says recovery used the side file.
package raftlog
