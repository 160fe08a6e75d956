// Package content writes a volume's files atomically, in the layout the kubelet
// uses for Secret, ConfigMap and projected volumes, so that a pod reading its
// files while they are refreshed sees either the complete old set or the complete
// new set, never a mix and never a partially written file.
//
// # Layout
//
// For a volume directory dir and the file set {"token", "conf/app.ini"}:
//
//	dir/..2026_05_01_12_00_00.3920412/        timestamped, immutable once published
//	dir/..2026_05_01_12_00_00.3920412/token
//	dir/..2026_05_01_12_00_00.3920412/conf/app.ini
//	dir/..data -> ..2026_05_01_12_00_00.3920412
//	dir/token  -> ..data/token                 user-visible, created once
//	dir/conf   -> ..data/conf
//
// [Write] fills a fresh timestamped directory, fsyncs every file and directory
// in it, creates the symlink ..data_tmp pointing at it and renames ..data_tmp over
// ..data. rename(2) replaces ..data atomically, so every path resolution through
// ..data (and so through every user-visible link) lands in exactly one complete
// set. Write then creates missing user-visible links, removes links of names that
// left the set, and removes the previous timestamped directory (and any orphan
// left by an earlier crashed Write).
//
// The guarantee is per path resolution. A reader that opens dir/a and then dir/b
// may straddle a swap and see a from the old set and b from the new one. A reader
// that needs several files from the same set resolves ..data once (readlink) and
// opens dir/<resolved>/a and dir/<resolved>/b; if the set was replaced in between
// the open fails with ENOENT and the reader retries. This is the kubelet's
// guarantee too.
//
// # Idempotence
//
// When the file set equals the content ..data currently points at (same names,
// bytes, effective modes and, with Options.GID >= 0, group), Write does not swap:
// the timestamped directory and ..data stay as they are, so a refresh that changes
// nothing causes no churn for inotify watchers. It still repairs the user-visible
// links and removes orphaned timestamped directories.
//
// Names starting with ".." are reserved at every level of a path. An empty set
// written into a directory that never had content creates nothing.
//
// # Bounds
//
// A set is checked against Options.Limits before anything is written: at most
// DefaultMaxFiles files, paths of at most DefaultMaxPathBytes bytes and
// DefaultMaxDepth components of at most MaxNameBytes bytes each, and, when
// set, a Cost (data, path and FileOverhead per file) of at most MaxBytes.
// Every step is linear in the names, and Write stops between two files or
// directories once its context is done, the previous content in place and the
// half-written directory removed. Content that does not fit the volume (no
// space, no inodes, a quota) is ErrNoSpace, with the set's size in the
// message, never a descriptor's path.
//
// # Safety
//
// All file-system access goes through an [os.Root] opened on dir, so no
// operation ever resolves a path outside dir, whatever symlinks the pod planted
// in a writable volume. Files are created with O_EXCL in the fresh directory and
// their mode and group are set through the open descriptor (fchmod, fchown), never
// by name. A planted entry under a user-visible name (a file, a symlink, a
// directory) is replaced by the link; ..data and ..data_tmp are replaced as links,
// never written through. Links of vanished names are removed only when they still
// point at ..data/<name>, so files the pod created itself are left alone.
//
// Write is not safe for concurrent use on the same dir; the framework serializes
// operations per volume.
//
// # Windows
//
// Creating symlinks on Windows needs SeCreateSymbolicLinkPrivilege (or Developer
// Mode). The package compiles for Windows and all link operations go through the
// helpers in link.go (makeLink, readLink, replaceLink), so a Windows
// implementation can swap them without touching the rest:
//
//   - ..data as a directory junction (no privilege needed, directories only) to
//     the timestamped directory. A junction cannot be renamed over an existing
//     one atomically, so replaceLink would use MoveFileEx with
//     MOVEFILE_REPLACE_EXISTING on the junction, or fall back to remove-then-
//     rename, accepting a short window where ..data is missing.
//   - user-visible entries as junctions for directories and, for files, either
//     file symlinks when the privilege is held, or plain copies replaced with
//     MoveFileEx(MOVEFILE_REPLACE_EXISTING), which is atomic per file but loses
//     the all-files-from-one-set guarantee.
//
// Options.GID must be -1 on Windows (there is no chown).
package content
