//! A wrapper that records every frame a link sends or receives into a
//! classic pcap file (libpcap format, `pcap-savefile(5)`): link type
//! `LINKTYPE_ETHERNET` (1), snapshot length 65535 bytes, microsecond
//! wall-clock timestamps (`CLOCK_REALTIME`), host byte order.
//!
//! Each record (16-byte record header plus frame) reaches the file in one
//! `write(2)`, straight after the frame is sent or received; the file is
//! not buffered in the process. A daemon killed at any point therefore
//! leaves a file that `tshark`/`tcpdump -r` read up to the last frame.
//! Both directions share one file; the direction is not recorded (the
//! Ethernet source address tells them apart).

use std::fs::File;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};

use super::{Icrc, Link, Rx};

/// Snapshot length of the file, bytes: longer frames are cut to this length
/// in the file (their original length is kept in the record header, as
/// libpcap does; note that `pcap_file::pcap::PcapReader::next_packet` 2.0
/// rejects such records, `next_raw_packet` and Wireshark read them).
pub const SNAPLEN: u32 = 65535;

/// Collects what [`PcapWriter`] writes for one record, so the record can go
/// to the file in a single `write(2)` (the writer owns its sink and offers
/// no access to it, hence the shared buffer).
#[derive(Clone, Default)]
struct Staging(Arc<Mutex<Vec<u8>>>);

impl Staging {
    /// Writes the staged bytes to `file` and empties the stage.
    fn drain_to(&self, file: &mut File) -> io::Result<()> {
        self.drain_prefix_to(file, usize::MAX)
    }

    /// Writes the first `len` staged bytes to `file` and empties the stage.
    fn drain_prefix_to(&self, file: &mut File, len: usize) -> io::Result<()> {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let r = file.write_all(&v[..len.min(v.len())]);
        v.clear();
        r
    }

    /// Bytes staged.
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Write for Staging {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn pcap_err(e: pcap_file::PcapError) -> io::Error {
    match e {
        pcap_file::PcapError::IoError(io) => io,
        other => io::Error::new(io::ErrorKind::InvalidData, other),
    }
}

/// A [`Link`] that forwards to an inner link and records every frame sent
/// (when the inner link's `send` returned `Ok`, which includes frames it
/// dropped for a full queue) and every frame received into a pcap file.
///
/// Recording never changes what the link does: a failed file write (disk
/// full, ...) is logged once with `tracing::warn!`, counted in
/// [`PcapLink::write_errors`], and the frame still goes through.
pub struct PcapLink {
    inner: Box<dyn Link>,
    writer: PcapWriter<Staging>,
    staging: Staging,
    file: File,
    write_errors: u64,
    /// The frame [`Link::recv_with`] handed out, for its record.
    scratch: Vec<u8>,
    /// Its packets as frames of their own when it is a batch.
    split: Vec<u8>,
    /// Where each staged record of a [`Link::try_send_many`] ends.
    ends: Vec<usize>,
}

impl std::fmt::Debug for PcapLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapLink")
            .field("file", &self.file)
            .field("write_errors", &self.write_errors)
            .finish()
    }
}

impl PcapLink {
    /// Wraps `inner`, writing the pcap global header (24 bytes) to `file`
    /// at its current position. `file` should be newly created or truncated
    /// and opened for writing.
    ///
    /// # Errors
    /// The OS error of writing the header.
    pub fn new(inner: Box<dyn Link>, mut file: File) -> io::Result<PcapLink> {
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::MicroSecond,
            endianness: Endianness::native(),
        };
        let staging = Staging::default();
        let writer = PcapWriter::with_header(staging.clone(), header).map_err(pcap_err)?;
        staging.drain_to(&mut file)?;
        Ok(PcapLink {
            inner,
            writer,
            staging,
            file,
            write_errors: 0,
            scratch: Vec::new(),
            split: Vec::new(),
            ends: Vec::new(),
        })
    }

    /// Number of frames that could not be recorded.
    pub fn write_errors(&self) -> u64 {
        self.write_errors
    }

    /// The wrapped link.
    pub fn inner(&self) -> &dyn Link {
        self.inner.as_ref()
    }

    /// Unwraps, returning the inner link and the file.
    pub fn into_parts(self) -> (Box<dyn Link>, File) {
        (self.inner, self.file)
    }

    fn record(&mut self, frame: &[u8]) {
        if let Err(e) = self.try_record(frame) {
            if self.write_errors == 0 {
                tracing::warn!(error = %e, "pcap: cannot record frame; further failures are only counted");
            }
            self.write_errors += 1;
        }
    }

    /// Stages `frame`'s record (timestamp now); the caller drains it.
    fn stage(&mut self, frame: &[u8]) -> io::Result<()> {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        let orig_len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        let data = &frame[..frame.len().min(SNAPLEN as usize)];
        self.writer
            .write_packet(&PcapPacket::new(ts, orig_len, data))
            .map(|_| ())
            .map_err(pcap_err)
    }

    fn try_record(&mut self, frame: &[u8]) -> io::Result<()> {
        let written = self.stage(frame);
        // Drain even after an error so a half-staged record never reaches the file.
        let mut res = written.map(|_| ());
        if res.is_ok() {
            res = self.staging.drain_to(&mut self.file);
        } else {
            self.staging
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        }
        res
    }
}

impl Link for PcapLink {
    /// Sends through the inner link, then records the frame. Errors are the
    /// inner link's; a failed send is not recorded.
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        self.inner.send(frame)?;
        self.record(frame);
        Ok(())
    }

    /// Tries the inner link; records the frame when it was taken.
    fn try_send(&mut self, frame: &[u8]) -> io::Result<bool> {
        let taken = self.inner.try_send(frame)?;
        if taken {
            self.record(frame);
        }
        Ok(taken)
    }

    /// Hands the frames to the inner link in one go (so a batch reaches it
    /// whole: AF_PACKET's `sendmmsg`, a TAP's UDP super-frames, the
    /// switch's runs) and records those it took. The records are staged
    /// before the call (a link that keeps buffers, the switch, leaves
    /// others in their place) and only the taken frames' reach the file.
    fn try_send_many(&mut self, frames: &mut [Vec<u8>]) -> io::Result<usize> {
        let mut ends = std::mem::take(&mut self.ends);
        ends.clear();
        for f in frames.iter() {
            if self.stage(f).is_err() {
                self.write_errors += 1;
            }
            ends.push(self.staging.len());
        }
        let r = self.inner.try_send_many(frames);
        let taken = match r {
            Ok(n) => n.min(ends.len()),
            Err(_) => 0,
        };
        let upto = taken.checked_sub(1).and_then(|i| ends.get(i)).copied();
        if let Err(e) = self
            .staging
            .drain_prefix_to(&mut self.file, upto.unwrap_or(0))
        {
            if self.write_errors == 0 {
                tracing::warn!(error = %e, "pcap: cannot record frames; further failures are only counted");
            }
            self.write_errors += taken as u64;
        }
        self.ends = ends;
        r
    }

    /// Receives from the inner link and records what it hands out.
    /// [`Rx::Copy`]: the frame the inner link copied (as on a wire).
    /// [`Rx::Deliver`]: each frame as the inner link hands it out,
    /// recorded as on a wire: a frame that came without its ICRC
    /// ([`Icrc::Unneeded`]) is recorded with it
    /// ([`crate::wire::seal_icrc`]), so the file is what a capture of
    /// RoCEv2 traffic shows.
    fn receive(&mut self, rx: Rx<'_>) -> io::Result<Option<usize>> {
        let (buf, deliver) = match rx {
            Rx::Copy(buf) => {
                let got = self.inner.recv(buf)?;
                if let Some(frame) = got.and_then(|n| buf.get(..n)) {
                    self.record(frame);
                }
                return Ok(got);
            }
            Rx::Deliver(buf, deliver) => (buf, deliver),
        };
        let scratch = &mut self.scratch;
        let mut seen = None;
        let got = self.inner.receive(Rx::Deliver(buf, &mut |frame, icrc| {
            scratch.clear();
            scratch.extend_from_slice(frame);
            seen = Some(icrc);
            deliver(frame, icrc);
        }))?;
        if let Some(icrc) = seen {
            let f = std::mem::take(&mut self.scratch);
            if icrc == Icrc::Unneeded {
                // Sealed, a batch packet by packet (`batch::gso`).
                let mut out = std::mem::take(&mut self.split);
                crate::batch::gso::split(&f, &mut out, |p| self.record(p));
                self.split = out;
            } else {
                self.record(&f);
            }
            self.scratch = f;
        }
        Ok(got)
    }

    fn inner(&self) -> Option<&dyn Link> {
        Some(self.inner.as_ref())
    }

    fn inner_mut(&mut self) -> Option<&mut dyn Link> {
        Some(self.inner.as_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::MemLink;
    use pcap_file::pcap::PcapReader;

    /// A file path unique to this process and test, removed on drop.
    struct TempPath(std::path::PathBuf);
    impl TempPath {
        fn new(tag: &str) -> Self {
            Self(
                std::env::temp_dir()
                    .join(format!("vrnic-pcaplink-{}-{tag}.pcap", std::process::id())),
            )
        }
    }
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn read_back(path: &std::path::Path) -> (PcapHeader, Vec<Vec<u8>>) {
        let mut r = PcapReader::new(File::open(path).unwrap()).unwrap();
        let h = r.header();
        let mut frames = Vec::new();
        while let Some(p) = r.next_packet() {
            let p = p.unwrap();
            assert_eq!(p.orig_len as usize, p.data.len());
            assert!(
                p.timestamp > Duration::from_secs(1_600_000_000),
                "wall-clock timestamp"
            );
            frames.push(p.data.into_owned());
        }
        (h, frames)
    }

    #[test]
    fn pcap_link_records_sent_and_received_frames() {
        let tmp = TempPath::new("rw");
        let (a, mut b) = MemLink::pair();
        let mut l = PcapLink::new(Box::new(a), File::create(&tmp.0).unwrap()).unwrap();
        let sent: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 60 + i as usize]).collect();
        for f in &sent {
            l.send(f).unwrap();
        }
        b.send(&[0xaa; 1514]).unwrap();
        let mut buf = [0u8; 2048];
        assert_eq!(l.recv(&mut buf).unwrap(), Some(1514));
        assert_eq!(l.recv(&mut buf).unwrap(), None);

        // Read while the link is still open (as after the daemon is killed):
        // nothing may be waiting in a buffer.
        let (h, frames) = read_back(&tmp.0);
        assert_eq!(h.datalink, DataLink::ETHERNET);
        assert_eq!(h.snaplen, SNAPLEN);
        let mut want = sent.clone();
        want.push(vec![0xaa; 1514]);
        assert_eq!(frames, want);
        assert_eq!(l.write_errors(), 0);

        // The peer got exactly the frames sent.
        let mut got = Vec::new();
        while let Some(n) = b.recv(&mut buf).unwrap() {
            got.push(buf[..n].to_vec());
        }
        assert_eq!(got, sent);
    }

    /// A batch reaches the inner link whole and only the frames it took
    /// are recorded, in order; the rest are recorded when taken later.
    #[test]
    fn pcap_link_records_the_frames_of_a_batch_the_link_took() {
        let tmp = TempPath::new("many");
        let (a, mut b) = MemLink::pair_with_depth(3);
        let mut l = PcapLink::new(Box::new(a), File::create(&tmp.0).unwrap()).unwrap();
        let sent: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 60 + i as usize]).collect();
        let mut batch = sent.clone();
        assert_eq!(
            l.try_send_many(&mut batch).unwrap(),
            3,
            "the peer's queue holds 3"
        );
        assert_eq!(read_back(&tmp.0).1, sent[..3], "only the frames taken");
        let mut buf = [0u8; 2048];
        for _ in 0..3 {
            assert!(b.recv(&mut buf).unwrap().is_some());
        }
        assert_eq!(l.try_send_many(&mut batch[3..]).unwrap(), 2);
        assert_eq!(read_back(&tmp.0).1, sent);
        assert_eq!(l.write_errors(), 0);
    }

    #[test]
    fn pcap_link_truncates_to_snaplen_keeping_the_original_length() {
        let tmp = TempPath::new("snap");
        let (a, _b) = MemLink::pair();
        let mut l = PcapLink::new(Box::new(a), File::create(&tmp.0).unwrap()).unwrap();
        l.send(&vec![7u8; SNAPLEN as usize + 10]).unwrap();
        let mut r = PcapReader::new(File::open(&tmp.0).unwrap()).unwrap();
        // Raw: pcap-file 2.0's validating reader refuses orig_len > snaplen,
        // which libpcap and Wireshark accept (it is what truncation means).
        let p = r.next_raw_packet().unwrap().unwrap();
        assert_eq!(p.data.len(), SNAPLEN as usize);
        assert_eq!(p.incl_len, SNAPLEN);
        assert_eq!(p.orig_len, SNAPLEN + 10);
    }

    #[test]
    fn pcap_link_keeps_forwarding_when_the_file_cannot_be_written() {
        let tmp = TempPath::new("ro");
        File::create(&tmp.0).unwrap();
        // A read-only handle: the header write fails, and `new` says so.
        let (a, _b) = MemLink::pair();
        assert!(PcapLink::new(Box::new(a), File::open(&tmp.0).unwrap()).is_err());

        // Every record write fails (/dev/full: ENOSPC): frames still flow.
        let (a, mut b) = MemLink::pair();
        let mut l = PcapLink::new(Box::new(a), File::create(&tmp.0).unwrap()).unwrap();
        l.file = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        l.send(b"frame").unwrap();
        l.send(b"frame2").unwrap();
        assert_eq!(l.write_errors(), 2);
        let mut buf = [0u8; 16];
        assert_eq!(b.recv(&mut buf).unwrap(), Some(5));
        assert_eq!(b.recv(&mut buf).unwrap(), Some(6));
    }
}
