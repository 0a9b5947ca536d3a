//! RAM backend: one anonymous private mapping (`MAP_NORESERVE`), committed
//! page by page as it is written, so a large device costs nothing until used.
//! By default it asks for transparent huge pages (`MADV_HUGEPAGE`): pages
//! are then 2 MiB where the kernel allows it, and random I/O misses the TLB
//! far less (4K reads and writes 1.07× the IOPS on a warm 1 GiB device,
//! docs/bench/2026-11-26-hot-buffers.md). Without them
//! (`MADV_NOHUGEPAGE`, even where the kernel's mode is `always`) memory is
//! committed 4 KiB at a time and a deallocate gives it back at once.
//!
//! Every reactor thread copies in and out of the same region. No Rust
//! reference to the region is ever formed; all access is raw-pointer copies.

use checksum::Appender;
use std::io;
use std::ptr::NonNull;

pub(crate) struct RamRegion {
    base: NonNull<u8>,
    len: usize,
    page: usize,
}

// SAFETY: the region is plain memory owned by this value. Concurrent access
// from several threads only ever goes through raw-pointer copies
// (`copy_nonoverlapping`, `write_bytes`) and `madvise`; no `&`/`&mut` to the
// region exists, so there is no aliasing UB. Concurrent overlapping I/O yields
// unspecified bytes, exactly as on a real disk, which the block contract allows.
unsafe impl Send for RamRegion {}
// SAFETY: see `Send` above; shared `&RamRegion` only allows those raw copies.
unsafe impl Sync for RamRegion {}

impl RamRegion {
    pub(crate) fn new(size_bytes: u64, huge_pages: bool) -> io::Result<RamRegion> {
        let len = usize::try_from(size_bytes)
            .map_err(|_| io::Error::other(format!("ram size {size_bytes} exceeds address space")))?;
        // SAFETY: anonymous mapping with no address hint and no fd: it
        // creates fresh memory and cannot affect existing mappings.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        // Transparent huge pages where the kernel offers them on request
        // (Debian's default is `madvise`): random block I/O over a large
        // device otherwise misses the TLB on nearly every copy. Refused or
        // unsupported, the mapping simply keeps small pages. Turned off,
        // the mapping keeps small pages whatever the kernel's mode.
        let advice = if huge_pages { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE };
        // SAFETY: advice on the mapping just created, over its whole length.
        let _ = unsafe { libc::madvise(ptr, len, advice) };
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page = usize::try_from(page).ok().filter(|p| p.is_power_of_two()).unwrap_or(4096);
        Ok(RamRegion { base, len, page })
    }

    /// Start of `[offset, offset + len)` inside the region, or an error if the
    /// span does not fit (callers range-check first; this is the backstop).
    fn span(&self, offset: u64, len: usize) -> io::Result<(*mut u8, usize)> {
        let start = usize::try_from(offset).ok();
        let end = start.and_then(|s| s.checked_add(len));
        match (start, end) {
            (Some(start), Some(end)) if end <= self.len => {
                // SAFETY: start <= end <= self.len, so the result stays inside
                // (or one past the end of) the mapping.
                Ok((unsafe { self.base.as_ptr().add(start) }, start))
            }
            _ => {
                Err(io::Error::other(format!("ram span at byte {offset} + {len} exceeds region of {} bytes", self.len)))
            }
        }
    }

    pub(crate) fn read(&self, offset: u64, dst: &mut [u8]) -> io::Result<()> {
        let (src, _) = self.span(offset, dst.len())?;
        // SAFETY: `src..src+len` is inside the live mapping (checked by
        // `span`) and `dst` is a distinct heap buffer, so they don't overlap.
        // Other threads may write the same bytes concurrently through raw
        // pointers; the data read is then unspecified, but no reference to
        // the shared region is formed.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// As [`read`](Self::read), appending the `len` bytes to `out`: they
    /// are copied into its spare capacity, with no zeroing first, and fed
    /// to its CRC (if it keeps one) by the same loads.
    pub(crate) fn read_append(&self, offset: u64, len: usize, out: &mut Appender<'_>) -> io::Result<()> {
        let (src, _) = self.span(offset, len)?;
        // SAFETY: `src..src+len` is inside the live mapping (checked by
        // `span`), which the appender's own allocation is not part of. As
        // in `read`, concurrent writers only make the bytes unspecified: no
        // reference to the shared region is formed.
        unsafe { out.extend_from_ptr(src, len) };
        Ok(())
    }

    pub(crate) fn write(&self, offset: u64, src: &[u8]) -> io::Result<()> {
        let (dst, _) = self.span(offset, src.len())?;
        // SAFETY: as in `read`, with the copy direction reversed.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Zeroes a span: `madvise(MADV_DONTNEED)` on the whole pages inside it
    /// (they read back as zeros and return their memory) and explicit zeroing
    /// of the partial pages at either end.
    pub(crate) fn zero(&self, offset: u64, len: usize) -> io::Result<()> {
        let (start_ptr, start) = self.span(offset, len)?;
        let end = start.checked_add(len).ok_or_else(|| io::Error::other("ram span overflows"))?;
        let mask = self.page.wrapping_sub(1);
        let first_page = start.checked_add(mask).map(|v| v & !mask).unwrap_or(end).min(end);
        let last_page = (end & !mask).max(first_page);
        let head = first_page.saturating_sub(start);
        // SAFETY: `start_ptr..start_ptr+head` lies within the checked span.
        unsafe { std::ptr::write_bytes(start_ptr, 0, head) };
        if last_page > first_page {
            // SAFETY: `first_page..last_page` is page-aligned (the mapping base
            // is page-aligned) and inside the checked span. MADV_DONTNEED on a
            // private anonymous mapping drops the pages; later reads see zeros.
            let rc = unsafe {
                libc::madvise(self.base.as_ptr().add(first_page).cast(), last_page - first_page, libc::MADV_DONTNEED)
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let tail = end.saturating_sub(last_page);
        // SAFETY: `last_page..end` lies within the checked span.
        unsafe { std::ptr::write_bytes(self.base.as_ptr().add(last_page), 0, tail) };
        Ok(())
    }
}

impl Drop for RamRegion {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` describe exactly the mapping created in `new`,
        // and no I/O can be in flight: every access borrows `&self`.
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        if rc != 0 {
            log::error!("munmap of ram device failed: {}", io::Error::last_os_error());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `/proc/self/smaps` fields of the mapping that holds `addr`
    /// (neighbouring mappings with the same flags merge with it); `None`
    /// where smaps cannot be read.
    fn smaps_of(addr: usize) -> Option<Vec<String>> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut lines = smaps.lines();
        while let Some(l) = lines.next() {
            let range = l.split_whitespace().next().and_then(|r| r.split_once('-'));
            let Some((lo, hi)) = range
                .and_then(|(lo, hi)| Some((usize::from_str_radix(lo, 16).ok()?, usize::from_str_radix(hi, 16).ok()?)))
            else {
                continue;
            };
            if (lo..hi).contains(&addr) {
                // Field lines ("Rss:  0 kB") up to the next mapping's header.
                return Some(
                    lines
                        .take_while(|l| l.split_whitespace().next().is_some_and(|k| k.ends_with(':')))
                        .map(str::to_owned)
                        .collect(),
                );
            }
        }
        None
    }

    /// Pages of `[base, base + len)` resident in memory.
    fn resident_pages(r: &RamRegion, len: usize) -> usize {
        let mut vec = vec![0u8; len.div_ceil(r.page)];
        // SAFETY: the range is inside the live mapping (page-aligned base)
        // and `vec` has a byte per page of it.
        let rc = unsafe { libc::mincore(r.base.as_ptr().cast(), len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    #[test]
    fn the_region_asks_for_huge_pages_where_the_kernel_offers_them() {
        let len = 64 << 20;
        let r = RamRegion::new(len as u64, true).expect("region");
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        // A process or kernel that refuses huge pages (`[never]`,
        // PR_SET_THP_DISABLE, no THPeligible field) has nothing to show.
        let flags = smaps_of(r.base.as_ptr() as usize).unwrap_or_default();
        let eligible = flags.iter().find(|l| l.starts_with("THPeligible:"));
        // SAFETY: prctl(PR_GET_THP_DISABLE) only reads a process flag.
        let disabled = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) } == 1;
        if let (Some(eligible), false, true) =
            (eligible, disabled, thp.contains("[madvise]") || thp.contains("[always]"))
        {
            assert!(
                flags.iter().any(|l| l.starts_with("VmFlags:") && l.split_whitespace().any(|f| f == "hg")),
                "no hg in VmFlags ({eligible})"
            );
        }
        // Still committed only as written.
        assert_eq!(resident_pages(&r, len), 0);
        r.write(0, &[7u8; 4096]).expect("write");
        let mut back = [0u8; 4096];
        r.read(0, &mut back).expect("read");
        assert_eq!(back, [7u8; 4096]);
        assert!(resident_pages(&r, len) > 0);
    }

    #[test]
    fn without_huge_pages_a_deallocated_page_is_given_back_at_once() {
        let len = 8 << 20;
        let r = RamRegion::new(len as u64, false).expect("region");
        // A kernel without THP has no advice to record (no flags to show).
        let flags = smaps_of(r.base.as_ptr() as usize).unwrap_or_default();
        if flags.iter().any(|l| l.starts_with("THPeligible:")) {
            assert!(
                flags.iter().any(|l| l.starts_with("VmFlags:") && l.split_whitespace().any(|f| f == "nh")),
                "no nh in VmFlags: {flags:?}"
            );
        }
        // Two pages written in the middle of a 2 MiB stretch: only those
        // two are committed, and freeing one gives exactly it back.
        let at = 3 << 20;
        r.write(at as u64, &[1u8; 8192]).expect("write");
        assert_eq!(resident_pages(&r, len), 2);
        r.zero(at as u64, 4096).expect("zero");
        assert_eq!(resident_pages(&r, len), 1);
        let mut back = [9u8; 8192];
        r.read(at as u64, &mut back).expect("read");
        assert!(back[..4096].iter().all(|&b| b == 0), "the freed page reads back as zeros");
        assert!(back[4096..].iter().all(|&b| b == 1), "its neighbour kept its data");
    }
}
