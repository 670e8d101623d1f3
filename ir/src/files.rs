//! The file rules every llada tool keeps, in one place:
//! - a file is read only if it is a regular file (not a FIFO, device, socket or directory,
//!   which could block forever or never end), and only up to a bound its kind of content
//!   needs;
//! - a file is written to a new file beside its destination and moved into place only when
//!   complete, only over a regular file or nothing, and never over a file the same command
//!   reads (compared by device and inode, so hard links and other spellings count);
//! - an interrupted write leaves nothing behind: on Linux the new file has no name until it is
//!   complete (`O_TMPFILE`).
//!
//! Errors are `std::io::Error`s whose text says what is wrong with the file; callers put the
//! path in front, as for any other I/O error.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// Bounds on what the tools read, by kind of file. Real files are far below each; a file past
/// its bound is not what its name says (or is `/dev/zero` behind a link).
/// JSON configs (`config.json`, `generation_config.json`, `tokenizer_config.json` with its chat
/// template, a shard index): kilobytes in real checkpoints.
pub const CONFIG_LIMIT: u64 = 64 << 20;
/// Tokenizer files (`tokenizer.json`, `vocab.json`, `merges.txt`): tens of megabytes at most.
pub const TOKENIZER_LIMIT: u64 = 512 << 20;
/// Data files the tools take (golden outputs, task lists, roofline reports).
pub const DATA_LIMIT: u64 = 1 << 30;

/// What a file system object is, in words, for messages.
pub fn kind_name(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn not_regular(meta: &Metadata) -> io::Error {
    invalid(format!("is {}, not a regular file", kind_name(meta)))
}

/// Opens `path` for reading if it is a regular file (following symbolic links). The type is
/// checked before opening, so a FIFO is never opened (opening one blocks until a writer
/// comes), and again on the open file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    Ok(file)
}

/// Reads a whole regular file of at most `limit` bytes.
pub fn read_bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let len = file.metadata()?.len();
    if len > limit {
        return Err(too_large(len, limit));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // The bound holds even if the file grows while it is read.
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64, limit));
    }
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_text_bounded(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read_bounded(path, limit)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("is not UTF-8 text (invalid byte at {})", e.utf8_error().valid_up_to())))
}

fn too_large(len: u64, limit: u64) -> io::Error {
    invalid(format!("is {len} bytes or more, larger than the {limit} bytes such a file may have"))
}

/// A file's identity: device and inode. Two paths with the same identity are the same file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    fn of(meta: &Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId { dev: meta.dev(), ino: meta.ino() }
    }

    /// The identity of the file at `path` (following links), if there is one.
    pub fn of_path(path: &Path) -> Option<FileId> {
        std::fs::metadata(path).ok().map(|m| FileId::of(&m))
    }
}

/// The files a command reads, by identity: each path given, and for a directory every entry
/// directly inside it (a checkpoint folder's files).
pub fn inputs(paths: &[&Path]) -> Vec<(PathBuf, FileId)> {
    let mut out = Vec::new();
    for &p in paths {
        let Ok(meta) = std::fs::metadata(p) else { continue };
        out.push((p.to_path_buf(), FileId::of(&meta)));
        if meta.is_dir() {
            for entry in std::fs::read_dir(p).into_iter().flatten().flatten() {
                if let Ok(m) = std::fs::metadata(entry.path()) {
                    out.push((entry.path(), FileId::of(&m)));
                }
            }
        }
    }
    out
}

/// A file being written: complete and in place at its destination only after
/// [`commit`](Self::commit). Dropped before that, it leaves nothing.
pub struct AtomicFile {
    file: File,
    dest: PathBuf,
    inputs: Vec<(PathBuf, FileId)>,
    /// The temporary name, where the file has one (no `O_TMPFILE`).
    named: Option<PathBuf>,
}

impl AtomicFile {
    /// Starts writing `dest`. Refused now, before any work, if `dest` exists and is not a
    /// regular file (or a link to one), or is one of `reads` (see [`inputs`]).
    pub fn create(dest: &Path, reads: &[&Path]) -> io::Result<AtomicFile> {
        let dest = resolve_destination(dest)?;
        let inputs = inputs(reads);
        check_not_an_input(&dest, &inputs)?;
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !dir.is_dir() {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("the folder {} does not exist", dir.display())));
        }
        let (file, named) = match unnamed_in(&dir) {
            Some(file) => (file, None),
            None => {
                let (file, path) = named_in(&dir, &dest)?;
                (file, Some(path))
            }
        };
        Ok(AtomicFile { file, dest, inputs, named })
    }

    /// The file being written.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// The destination (links resolved).
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Flushes the file to disk and moves it into place.
    pub fn commit(mut self) -> io::Result<()> {
        self.file.sync_all()?;
        // The destination may have changed since `create` (another program); check again.
        let dest = resolve_destination(&self.dest)?;
        check_not_an_input(&dest, &self.inputs)?;
        match self.named.take() {
            Some(tmp) => std::fs::rename(&tmp, &dest).inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            }),
            None => link_into_place(&self.file, &dest),
        }
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let Some(tmp) = &self.named {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// Whether `dest` may be written by a command that reads `reads` (see [`AtomicFile::create`]):
/// for a check before long work.
pub fn check_destination(dest: &Path, reads: &[&Path]) -> io::Result<()> {
    check_not_an_input(&resolve_destination(dest)?, &inputs(reads))
}

/// Writes `bytes` to `dest` through an [`AtomicFile`].
pub fn write_atomic(dest: &Path, reads: &[&Path], bytes: &[u8]) -> io::Result<()> {
    let mut out = AtomicFile::create(dest, reads)?;
    out.file().write_all(bytes)?;
    out.commit()
}

/// The path to write: `dest` itself, or the file a symbolic link at `dest` points to. Refuses
/// anything but a regular file or nothing.
fn resolve_destination(dest: &Path) -> io::Result<PathBuf> {
    // A trailing separator names a folder, which a file cannot be renamed onto.
    if dest.as_os_str().as_encoded_bytes().last().is_some_and(|&b| std::path::is_separator(b as char)) {
        return Err(invalid("ends in a path separator, which names a folder; give the file's name".into()));
    }
    match std::fs::symlink_metadata(dest) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(dest.to_path_buf()),
        Err(e) => Err(e),
        Ok(m) if m.is_file() => Ok(dest.to_path_buf()),
        Ok(m) if m.file_type().is_symlink() => match std::fs::metadata(dest) {
            Ok(target) if target.is_file() => std::fs::canonicalize(dest),
            Ok(target) => Err(invalid(format!("is a link to {}; only a regular file may be replaced", kind_name(&target)))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(invalid("is a link to nothing; remove it or write elsewhere".into())),
            Err(e) => Err(e),
        },
        Ok(m) => Err(invalid(format!("is {}; only a regular file may be replaced", kind_name(&m)))),
    }
}

fn check_not_an_input(dest: &Path, inputs: &[(PathBuf, FileId)]) -> io::Result<()> {
    let Some(id) = FileId::of_path(dest) else { return Ok(()) };
    match inputs.iter().find(|(_, input)| *input == id) {
        Some((path, _)) if path.as_path() == dest => Err(invalid("is also read by this command; write elsewhere".into())),
        Some((path, _)) => Err(invalid(format!("is the same file as {}, which this command reads; write elsewhere", path.display()))),
        None => Ok(()),
    }
}

/// A file with no name yet in `dir` (Linux's `O_TMPFILE`), where the file system has them.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn unnamed_in(dir: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new().read(true).write(true).mode(0o644).custom_flags(libc::O_TMPFILE).open(dir).ok()
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn unnamed_in(_dir: &Path) -> Option<File> {
    None
}

/// A new file `.NAME.PID.N.partial` beside `dest`.
fn named_in(dir: &Path, dest: &Path) -> io::Result<(File, PathBuf)> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".{name}.{}.{n}.partial", std::process::id()));
        match OpenOptions::new().read(true).write(true).create_new(true).mode(0o644).open(&path) {
            Ok(file) => return Ok((file, path)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Gives the unnamed `file` the name `dest`: directly when `dest` does not exist, else under a
/// temporary name that is then renamed over `dest` (rename replaces atomically; a link never
/// replaces).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn link_into_place(file: &File, dest: &Path) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    if link(file, dest).is_ok() {
        return Ok(());
    }
    let dir = dest.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.{}.partial", std::process::id(), file.as_raw_fd()));
    let _ = std::fs::remove_file(&tmp);
    link(file, &tmp)?;
    std::fs::rename(&tmp, dest).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn link(file: &File, to: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::io::AsRawFd;
    let from = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).expect("no NUL in a number");
    let to = CString::new(to.as_os_str().as_bytes()).map_err(|_| invalid("has a NUL byte in its name".into()))?;
    // SAFETY: both are valid NUL-terminated strings that outlive the call; linkat reads them only.
    let rc = unsafe { libc::linkat(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_SYMLINK_FOLLOW) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn link_into_place(_file: &File, _dest: &Path) -> io::Result<()> {
    unreachable!("files without names exist only on Linux")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_write_appears_whole_or_not_at_all() {
        let dir = tempdir();
        let dest = dir.join("out.bin");
        let mut out = AtomicFile::create(&dest, &[]).unwrap();
        out.file().write_all(b"half").unwrap();
        drop(out);
        assert!(listing(&dir).is_empty(), "an abandoned write left {:?}", listing(&dir));
        write_atomic(&dest, &[], b"first").unwrap();
        write_atomic(&dest, &[], b"second").unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"second");
        assert_eq!(listing(&dir), ["out.bin"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn inputs_and_special_files_are_never_replaced() {
        let dir = tempdir();
        let input = dir.join("model");
        std::fs::create_dir(&input).unwrap();
        std::fs::write(input.join("weights"), b"w").unwrap();
        std::fs::hard_link(input.join("weights"), dir.join("alias")).unwrap();
        let e = write_atomic(&input.join("weights"), &[&input], b"x").unwrap_err();
        assert!(e.to_string().contains("read by this command"), "{e}");
        let e = write_atomic(&dir.join("alias"), &[&input], b"x").unwrap_err();
        assert!(e.to_string().contains("same file as"), "{e}");
        assert_eq!(std::fs::read(input.join("weights")).unwrap(), b"w");
        let e = write_atomic(Path::new("/dev/null"), &[], b"x").unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let e = write_atomic(&input, &[], b"x").unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
        // A new name ending in '/' is a folder's, refused before anything is written.
        let e = check_destination(&dir.join("new/"), &[]).unwrap_err();
        assert!(e.to_string().contains("names a folder"), "{e}");
        assert!(write_atomic(&dir.join("new/"), &[], b"x").is_err() && !dir.join("new").exists());
        std::os::unix::fs::symlink(dir.join("nowhere"), dir.join("dangling")).unwrap();
        assert!(write_atomic(&dir.join("dangling"), &[], b"x").unwrap_err().to_string().contains("link to nothing"));
        std::os::unix::fs::symlink(input.join("weights"), dir.join("link")).unwrap();
        assert!(write_atomic(&dir.join("link"), &[&input], b"x").is_err(), "a link to an input was written through");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_take_regular_files_within_their_bound() {
        let dir = tempdir();
        std::fs::write(dir.join("a"), b"12345").unwrap();
        assert_eq!(read_bounded(&dir.join("a"), 5).unwrap(), b"12345");
        assert!(read_bounded(&dir.join("a"), 4).unwrap_err().to_string().contains("larger than the 4 bytes"));
        assert!(read_bounded(Path::new("/dev/zero"), 1 << 20).unwrap_err().to_string().contains("character device"));
        assert!(read_bounded(&dir, 1 << 20).unwrap_err().to_string().contains("directory"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A fresh folder under the system's temporary folder (this crate has no tempfile
    /// dependency outside the writer).
    fn tempdir() -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!("llada-files-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
