//! Page-locked host rows for a decode step's small transfers: its inputs (token ids, positions,
//! KV slots, context lengths, block tables) go up and its picked ids come down without the host
//! waiting for the stream, so a step can be enqueued while the step before it still runs.
//!
//! Design: a [`PinnedRows`] is a page-locked u32 buffer and an event recorded after the last copy
//! that reads or writes it. The host waits on that event, never on the stream, before it touches
//! the buffer again, so work enqueued after that copy (the next step) is not waited for. A copy
//! from pageable memory would make the driver stage it (and the upload path before this one
//! synchronised the stream after its copies); from page-locked memory the copy engine reads the
//! host rows in stream order, which is why they must stay untouched until the event completes.
//! The runner keeps two sets and alternates between steps.

use cudarc::driver::{CudaEvent, PinnedHostSlice, result, sys};

use super::buffer::CudaBuffer;
use super::device::CudaBackend;
use super::driver_error::driver_err;
use crate::backend::{BackendError, DType, check_buffer};

/// Page-locked u32 rows on the host and the event of the last copy that used them.
pub struct PinnedRows {
    /// `[capacity]` u32.
    host: PinnedHostSlice<u32>,
    /// Recorded after the last copy enqueued from or into `host`.
    done: CudaEvent,
    /// Whether the device reads these rows (write-combined: fast to write, slow to read).
    upload: bool,
    /// Values the last download brought (valid once `done` completes).
    filled: usize,
}

impl CudaBackend {
    /// Page-locked rows for `len` u32 values: `upload` rows the host writes and the device
    /// reads (write-combined), else rows the device writes and the host reads.
    pub fn pinned_rows(&self, len: usize, upload: bool) -> Result<PinnedRows, BackendError> {
        let flags = if upload {
            sys::CU_MEMHOSTALLOC_WRITECOMBINED
        } else {
            0
        };
        // SAFETY: the rows are written (uploads) or filled by a download before they are read;
        // `staged_u32` only returns the values a download wrote.
        let host = unsafe { self.ctx.alloc_pinned_with_flags::<u32>(len.max(1), flags) }
            .map_err(driver_err)?;
        let done = self.ctx.new_event(None).map_err(driver_err)?;
        Ok(PinnedRows {
            host,
            done,
            upload,
            filled: 0,
        })
    }

    /// Writes the host values of `copies` into `rows` back to back (first waiting for the copies
    /// that last used them, and growing them when short), enqueues the upload of each into its
    /// device buffer and records `rows`' event. Returns without waiting for the stream.
    pub fn upload_u32_staged(
        &self,
        rows: &mut PinnedRows,
        copies: &mut [(&mut CudaBuffer, &[u32])],
    ) -> Result<(), BackendError> {
        if !rows.upload {
            return Err(BackendError::Device(
                "upload_u32_staged: rows made for downloads".into(),
            ));
        }
        for (buf, data) in copies.iter() {
            check_buffer(
                "upload_u32_staged",
                "buffer",
                &**buf,
                DType::U32,
                data.len(),
            )?;
        }
        let total: usize = copies.iter().map(|(_, d)| d.len()).sum();
        rows.done.synchronize().map_err(driver_err)?;
        if rows.host.len() < total {
            *rows = self.pinned_rows(total.next_power_of_two(), true)?;
        }
        let host = rows.host.as_mut_slice().map_err(driver_err)?; // [capacity]
        let mut at = 0;
        for (_, data) in copies.iter() {
            host[at..at + data.len()].copy_from_slice(data);
            at += data.len();
        }
        let host: &[u32] = host;
        let mut at = 0;
        for (buf, data) in copies.iter_mut() {
            if data.is_empty() {
                continue;
            }
            let src = &host[at..at + data.len()];
            at += data.len();
            // SAFETY: the buffer holds at least data.len() u32 (checked above); `src` is
            // page-locked memory owned by `rows`, which is not written again before `done`
            // (recorded below, after this copy) completes, nor freed before it (dropping a
            // `PinnedHostSlice` waits for its work, and `rows` is replaced only after `done`).
            unsafe { result::memcpy_htod_async(buf.ptr(), src, self.stream.cu_stream()) }
                .map_err(driver_err)?;
        }
        rows.done.record(&self.stream).map_err(driver_err)
    }

    /// Enqueues the download of the first `n` values of the u32 buffer `buf` into `rows` and
    /// records `rows`' event; nothing waits (read them with [`Self::staged_u32`]).
    pub fn download_u32_staged(
        &self,
        buf: &CudaBuffer,
        n: usize,
        rows: &mut PinnedRows,
    ) -> Result<(), BackendError> {
        if rows.upload {
            return Err(BackendError::Device(
                "download_u32_staged: rows made for uploads".into(),
            ));
        }
        check_buffer("download_u32_staged", "buf", buf, DType::U32, n)?;
        rows.done.synchronize().map_err(driver_err)?;
        if rows.host.len() < n {
            *rows = self.pinned_rows(n.next_power_of_two(), false)?;
        }
        rows.filled = n;
        if n == 0 {
            return rows.done.record(&self.stream).map_err(driver_err);
        }
        let host = rows.host.as_mut_slice().map_err(driver_err)?; // [capacity]
        // SAFETY: `buf` holds at least n u32 (checked above); the destination is page-locked
        // memory owned by `rows`, read only after `done` (recorded below) completes.
        unsafe {
            result::memcpy_dtoh_async(&mut host[..n], buf.ptr(), self.stream.cu_stream())
                .map_err(driver_err)?;
        }
        rows.done.record(&self.stream).map_err(driver_err)
    }

    /// Waits for the last copy of `rows` and returns the values its download brought.
    pub fn staged_u32<'a>(&self, rows: &'a PinnedRows) -> Result<&'a [u32], BackendError> {
        rows.done.synchronize().map_err(driver_err)?;
        let host = rows.host.as_slice().map_err(driver_err)?;
        Ok(&host[..rows.filled])
    }

    /// Enqueues a device copy of values `src_at .. src_at + n` of the u32 buffer `src` into
    /// `dst_at ..` of `dst`.
    pub fn copy_u32_at(
        &self,
        src: &CudaBuffer,
        src_at: usize,
        dst: &mut CudaBuffer,
        dst_at: usize,
        n: usize,
    ) -> Result<(), BackendError> {
        check_buffer("copy_u32_at", "src", src, DType::U32, src_at + n)?;
        check_buffer("copy_u32_at", "dst", dst, DType::U32, dst_at + n)?;
        self.copy_raw(
            dst.ptr() + 4 * dst_at as u64,
            src.ptr() + 4 * src_at as u64,
            n * 4,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;

    #[test]
    fn staged_rows_go_up_and_come_down_without_a_stream_wait() {
        let Some(b) = super::super::tests::device() else {
            return;
        };
        let mut up = b.pinned_rows(4, true).unwrap();
        let mut down = b.pinned_rows(2, false).unwrap();
        let mut x = b.alloc(DType::U32, 5).unwrap(); // [5]
        let mut y = b.alloc(DType::U32, 300).unwrap(); // [300]
        let big: Vec<u32> = (0..300).map(|i| i * 7 + 1).collect(); // [300]
        // More values than the rows hold: they grow.
        b.upload_u32_staged(&mut up, &mut [(&mut x, &[9, 8, 7, 6, 5]), (&mut y, &big)])
            .unwrap();
        // Overwriting the rows right away waits for the copies above, not for the stream.
        b.upload_u32_staged(&mut up, &mut [(&mut x, &[1, 2])])
            .unwrap();
        let mut z = b.alloc(DType::U32, 300).unwrap(); // [300]
        b.copy_u32_at(&y, 0, &mut z, 0, 300).unwrap();
        b.copy_u32_at(&y, 10, &mut z, 290, 10).unwrap();
        b.download_u32_staged(&z, 300, &mut down).unwrap();
        let mut want = big.clone();
        want.copy_within(10..20, 290);
        assert_eq!(b.staged_u32(&down).unwrap(), want.as_slice());
        b.download_u32_staged(&x, 5, &mut down).unwrap();
        assert_eq!(b.staged_u32(&down).unwrap(), &[1, 2, 7, 6, 5]);
        // Rows made for one direction refuse the other; sizes are checked.
        assert!(b.download_u32_staged(&x, 5, &mut up).is_err());
        assert!(
            b.upload_u32_staged(&mut down, &mut [(&mut x, &[1])])
                .is_err()
        );
        assert!(b.download_u32_staged(&x, 6, &mut down).is_err());
        assert!(b.copy_u32_at(&x, 0, &mut z, 0, 6).is_err());
        assert!(b.copy_u32_at(&y, 0, &mut z, 295, 6).is_err());
    }
}
