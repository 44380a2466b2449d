//! Opening the files of checkpoints and tables: regular files only, metadata read with a size cap.
//!
//! Every file the format layer reads or maps goes through [`open_regular`]: it opens with
//! `O_NONBLOCK` (so a FIFO or a device node cannot block `open(2)`), then checks with `fstat` on the
//! opened descriptor that it is a regular file, so what is checked is what is read. Symlinks are
//! followed (a link to a regular file is fine; a link to `/dev/zero` is refused).

use crate::error::{Error, Result};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Largest `table.json` (16 head sizes and a few names: a few KiB in practice).
pub const MAX_TABLE_META: u64 = 1 << 20;
/// Largest `config.json` of a model.
pub const MAX_CONFIG: u64 = 4 << 20;
/// Largest `model.safetensors.index.json` (one line per tensor of the model).
pub const MAX_INDEX: u64 = 64 << 20;

/// What kind of non-regular file `ft` is, in words.
fn kind_name(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Opens `path` read-only if it is a regular file; returns the file and its size in bytes.
/// A FIFO, device, socket or directory is an [`Error::Format`] naming the path and its kind,
/// never a blocking open.
pub fn open_regular(path: &Path) -> Result<(File, u64)> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io_path("opening", path, e))?;
    let md = f.metadata().map_err(|e| Error::io_path("stat", path, e))?;
    if !md.file_type().is_file() {
        return Err(Error::Format(format!(
            "{} is {}, not a regular file",
            path.display(),
            kind_name(md.file_type())
        )));
    }
    // O_NONBLOCK has no effect on regular files; reads block on the disk as usual.
    Ok((f, md.len()))
}

/// Reads a regular file of at most `cap` bytes whole. A larger file is an [`Error::Format`]
/// (no byte beyond `cap + 1` is read, so a file that grows while read is also refused).
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>> {
    let (f, size) = open_regular(path)?;
    let too_big = |n: u64| {
        Error::Format(format!(
            "{}: {n} bytes, more than the {cap} bytes a metadata file may have",
            path.display()
        ))
    };
    if size > cap {
        return Err(too_big(size));
    }
    let mut buf = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    f.take(cap + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io_path("reading", path, e))?;
    if buf.len() as u64 > cap {
        return Err(too_big(buf.len() as u64));
    }
    Ok(buf)
}

/// [`read_capped`] as UTF-8 text.
pub fn read_text_capped(path: &Path, cap: u64) -> Result<String> {
    String::from_utf8(read_capped(path, cap)?)
        .map_err(|e| Error::Format(format!("{}: not UTF-8 text: {e}", path.display())))
}

/// Refuses an empty path argument (an empty string from a caller, not a file name).
pub fn non_empty(path: &Path, what: &str) -> Result<()> {
    if path.as_os_str().is_empty() {
        return Err(Error::InvalidArgument(format!("{what} is an empty path")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_devices_are_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("f");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // A blocking open of a FIFO with no writer would hang this test.
        let e = open_regular(&fifo).unwrap_err().to_string();
        assert!(e.contains("a FIFO"), "{e}");
        let e = read_capped(Path::new("/dev/zero"), 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("character device"), "{e}");
        let e = open_regular(d.path()).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        // a symlink to a regular file is followed
        let f = d.path().join("r");
        std::fs::write(&f, b"abc").unwrap();
        std::os::unix::fs::symlink(&f, d.path().join("l")).unwrap();
        assert_eq!(read_capped(&d.path().join("l"), 3).unwrap(), b"abc");
        let e = read_capped(&f, 2).unwrap_err().to_string();
        assert!(e.contains("more than the 2 bytes"), "{e}");
        assert!(matches!(
            non_empty(Path::new(""), "checkpoint_dir"),
            Err(Error::InvalidArgument(_))
        ));
    }
}
