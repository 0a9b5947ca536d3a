//! TCP on the reactor's ring: listen/accept, connect, receive, send.

use crate::buf::{IoBuf, IoBufMut};
use crate::bufring::Receiver;
use crate::op::{result, Op};
use io_uring::{opcode, squeue, types};
use std::io;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;

/// Sends at least this large go out as zero-copy sends (`SEND_ZC`) where
/// the kernel has them, on connections that leave the machine. Over
/// loopback the kernel copies anyway and the notification only adds cost
/// (measured: 128 KiB reads at 0.39x of SPDK with it, 0.68x without; see
/// docs/architecture.md), so local connections never use it.
pub const ZERO_COPY_MIN: usize = 64 * 1024;

/// The zero-copy threshold for a connection between `local` and `peer`.
fn zero_copy_min(local: io::Result<SocketAddr>, peer: io::Result<SocketAddr>) -> usize {
    match (local, peer) {
        (Ok(l), Ok(p)) if !p.ip().is_loopback() && l.ip() != p.ip() => ZERO_COPY_MIN,
        _ => usize::MAX,
    }
}

/// What one send of a loop that sends everything achieved: bytes sent (0
/// when interrupted, to try again), or the error that ends it (a peer that
/// takes nothing more is one).
fn progress(res: i32) -> io::Result<usize> {
    match result(res) {
        Ok(0) => Err(io::Error::new(io::ErrorKind::WriteZero, "the peer takes no more bytes")),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        r => r,
    }
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// `addr` as a C socket address.
fn sockaddr(addr: SocketAddr) -> (Box<libc::sockaddr_storage>, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: Box<libc::sockaddr_storage> = Box::new(unsafe { std::mem::zeroed() });
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any
            // socket address type.
            let sin = unsafe { &mut *(ss.as_mut() as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above.
            let sin6 = unsafe { &mut *(ss.as_mut() as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn new_socket(addr: &SocketAddr) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain syscall; the result is checked.
    let fd = cvt(unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_int_opt(fd: RawFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: the option value is a live c_int of the size passed.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// Runs `f` on a std view of the socket, without taking ownership.
fn with_std<R>(fd: RawFd, f: impl FnOnce(&std::net::TcpStream) -> R) -> R {
    // SAFETY: the view is never dropped (ManuallyDrop), so it does not
    // close the descriptor it borrows for the duration of `f`.
    let s = ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
    f(&s)
}

/// A connected socket's descriptor and, where the ring has a table of
/// registered files ([`crate::Features::fixed_files`]), its slot there:
/// operations then name the slot, and the kernel takes no reference on the
/// file per operation. The slot is emptied when the socket drops, so the
/// socket closes as a plain descriptor would.
pub(crate) struct Socket {
    fd: OwnedFd,
    /// The slot, and the runtime ([`crate::rt::Core::serial`]) whose ring
    /// holds it: under a later runtime of the thread (a socket kept from
    /// one `block_on` to the next) that number is another socket's.
    slot: Option<(u32, u64)>,
}

impl Socket {
    /// Adopts `fd`, registering it with this thread's ring if it can.
    fn new(fd: OwnedFd) -> Socket {
        let slot = crate::rt::try_with_core(|c| c.register_file(fd.as_raw_fd()).map(|s| (s, c.serial()))).flatten();
        Socket { fd, slot }
    }

    /// What a submission names the socket by (its slot, or its descriptor)
    /// and the flags that go with it.
    pub(crate) fn target(&self) -> (types::Fd, squeue::Flags) {
        match self.slot {
            // A slot is below the table's size, which fits an i32.
            Some((slot, ring)) if crate::rt::try_with_core(|c| c.serial()) == Some(ring) => {
                (types::Fd(slot as i32), squeue::Flags::FIXED_FILE)
            }
            _ => (types::Fd(self.fd.as_raw_fd()), squeue::Flags::empty()),
        }
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        if let Some((slot, ring)) = self.slot {
            // Only in the ring that holds it (a ring that is gone let go of
            // its table when it closed).
            crate::rt::try_with_core(|c| {
                if c.serial() == ring {
                    c.unregister_file(slot);
                }
            });
        }
    }
}

/// A listening TCP socket.
pub struct TcpListener {
    fd: Rc<OwnedFd>,
}

impl TcpListener {
    /// Binds `addr` with SO_REUSEADDR and SO_REUSEPORT (so each reactor can
    /// bind the same address and the kernel spreads connections) and
    /// listens with a backlog of `backlog`.
    pub fn bind_reuse_port(addr: SocketAddr, backlog: i32) -> io::Result<TcpListener> {
        let fd = new_socket(&addr)?;
        let raw = fd.as_raw_fd();
        set_int_opt(raw, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        set_int_opt(raw, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
        let (ss, len) = sockaddr(addr);
        // SAFETY: `ss` holds a socket address of `len` bytes.
        cvt(unsafe { libc::bind(raw, (ss.as_ref() as *const libc::sockaddr_storage).cast(), len) })?;
        // SAFETY: plain syscall.
        cvt(unsafe { libc::listen(raw, backlog) })?;
        Ok(TcpListener { fd: Rc::new(fd) })
    }

    /// Adopts a bound, listening std socket.
    pub fn from_std(l: std::net::TcpListener) -> TcpListener {
        TcpListener { fd: Rc::new(OwnedFd::from(l)) }
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        // SAFETY: a TcpListener view used only for getsockname.
        let l = ManuallyDrop::new(unsafe { std::net::TcpListener::from_raw_fd(self.fd.as_raw_fd()) });
        l.local_addr()
    }

    /// The next connection and its peer.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let entry = opcode::Accept::new(types::Fd(self.fd.as_raw_fd()), std::ptr::null_mut(), std::ptr::null_mut())
            .flags(libc::SOCK_CLOEXEC)
            .build();
        // Dropped after the kernel accepted (a timeout or race that ended
        // the same turn), the new connection is closed, not leaked.
        let done = Op::submit(entry, self.fd.clone()).on_lost(close_accepted).await;
        let fd = result(done.res)?;
        // SAFETY: accept returned a fresh descriptor we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let mut stream = TcpStream { fd: Rc::new(Socket::new(fd)), zc_min: usize::MAX };
        let peer = stream.peer_addr()?;
        stream.zc_min = zero_copy_min(stream.local_addr(), Ok(peer));
        Ok((stream, peer))
    }
}

/// The result of an accept nobody took: the descriptor it made, closed.
fn close_accepted(_: &Rc<OwnedFd>, res: i32) {
    if res >= 0 {
        // SAFETY: the kernel made this descriptor for the dropped accept;
        // nothing else knows it.
        drop(unsafe { OwnedFd::from_raw_fd(res) });
    }
}

impl AsRawFd for TcpListener {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A connected TCP socket. Clones share the socket (one can receive while
/// another sends); it closes when the last one drops.
#[derive(Clone)]
pub struct TcpStream {
    fd: Rc<Socket>,
    /// Sends at least this large are zero-copy.
    zc_min: usize,
}

impl TcpStream {
    /// Connects to `addr`.
    pub async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
        TcpStream::connect_from(addr, None).await
    }

    /// Connects to `addr` from the local address `source` (any port), or
    /// from the one the kernel picks when `None`.
    pub async fn connect_from(addr: SocketAddr, source: Option<std::net::IpAddr>) -> io::Result<TcpStream> {
        let fd = Rc::new(new_socket(&addr)?);
        if let Some(ip) = source {
            let (ss, len) = sockaddr(SocketAddr::new(ip, 0));
            // SAFETY: a live socket and a sockaddr of the length given.
            cvt(unsafe { libc::bind(fd.as_raw_fd(), (ss.as_ref() as *const libc::sockaddr_storage).cast(), len) })?;
        }
        let (ss, len) = sockaddr(addr);
        let entry =
            opcode::Connect::new(types::Fd(fd.as_raw_fd()), (ss.as_ref() as *const libc::sockaddr_storage).cast(), len)
                .build();
        let done = Op::submit(entry, (ss, fd.clone())).await;
        let res = done.res;
        drop(done);
        result(res)?;
        let fd = Rc::try_unwrap(fd).map_err(|_| io::Error::other("connect: the socket is still shared"))?;
        let mut s = TcpStream { fd: Rc::new(Socket::new(fd)), zc_min: usize::MAX };
        s.zc_min = zero_copy_min(s.local_addr(), s.peer_addr());
        Ok(s)
    }

    /// Adopts a connected std socket.
    pub fn from_std(s: std::net::TcpStream) -> TcpStream {
        let zc_min = zero_copy_min(s.local_addr(), s.peer_addr());
        TcpStream { fd: Rc::new(Socket::new(OwnedFd::from(s))), zc_min }
    }

    /// Sets the smallest send that goes out zero-copy (`usize::MAX`: none).
    pub fn set_zero_copy_min(&mut self, bytes: usize) {
        self.zc_min = bytes;
    }

    pub(crate) fn socket(&self) -> &Rc<Socket> {
        &self.fd
    }

    /// Whether operations name the socket by its slot in the ring's table
    /// of registered files ([`crate::Features::fixed_files`]).
    pub fn is_registered(&self) -> bool {
        self.fd.target().1.contains(squeue::Flags::FIXED_FILE)
    }

    /// Sets TCP_NODELAY.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        with_std(self.fd.as_raw_fd(), |s| s.set_nodelay(on))
    }

    /// Sets TCP_USER_TIMEOUT: how long sent data may stay unacknowledged
    /// before the kernel drops the connection (0: the kernel's default).
    pub fn set_user_timeout(&self, ms: u32) -> io::Result<()> {
        let v: libc::c_uint = ms;
        // SAFETY: plain syscall on our live descriptor with a pointer to a
        // local of the size we pass.
        cvt(unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_USER_TIMEOUT,
                (&v as *const libc::c_uint).cast(),
                std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
            )
        })
        .map(drop)
    }

    /// The connection's maximum segment size (TCP_MAXSEG): the most payload
    /// bytes one TCP segment carries.
    pub fn mss(&self) -> io::Result<u32> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: plain syscall on our live descriptor into a local of the
        // size we pass.
        cvt(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_MAXSEG,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        })?;
        Ok(v.max(0) as u32)
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        with_std(self.fd.as_raw_fd(), |s| s.local_addr())
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        with_std(self.fd.as_raw_fd(), |s| s.peer_addr())
    }

    /// Two handles on the socket, one to receive and one to send.
    pub fn into_split(self) -> (TcpStream, TcpStream) {
        (self.clone(), self)
    }

    /// A receiver that takes the reactor's provided buffers (multishot).
    pub fn receiver(&self) -> Receiver {
        Receiver::new(self)
    }

    /// Receives into `buf`'s writable bytes: how many arrived (0 at end of
    /// stream) and the buffer back.
    pub async fn read<B: IoBufMut>(&self, mut buf: B) -> (io::Result<usize>, B) {
        let len = buf.bytes_total();
        let (fd, flags) = self.fd.target();
        let entry = opcode::Recv::new(fd, buf.write_ptr(), len as u32).build().flags(flags);
        let done = Op::submit(entry, (buf, self.fd.clone())).await;
        let (mut buf, _) = done.data;
        let n = result(done.res);
        if let Ok(n) = n {
            // SAFETY: the kernel wrote `n` bytes.
            unsafe { buf.set_init(n) };
        }
        (n, buf)
    }

    /// Sends all of `buf`: large buffers zero-copy where the kernel can.
    pub async fn write_all<B: IoBuf>(&self, buf: B) -> (io::Result<()>, B) {
        let total = buf.bytes_init();
        let zc = total >= self.zc_min && crate::rt::with_core(|c| c.features().send_zc);
        let mut data = (buf, self.fd.clone());
        let mut sent = 0usize;
        while sent < total {
            let ptr = data.0.read_ptr().wrapping_add(sent);
            let len = (total - sent).min(u32::MAX as usize) as u32;
            let (fd, flags) = self.fd.target();
            let entry = if zc {
                opcode::SendZc::new(fd, ptr, len).flags(libc::MSG_NOSIGNAL).build()
            } else {
                opcode::Send::new(fd, ptr, len).flags(libc::MSG_NOSIGNAL).build()
            }
            .flags(flags);
            let done = Op::submit(entry, data).await;
            data = done.data;
            match progress(done.res) {
                Ok(n) => sent += n,
                Err(e) => return (Err(e), data.0),
            }
        }
        (Ok(()), data.0)
    }

    /// Sends everything `g` holds, its spliced buffers' bytes from where
    /// they lie (`sendmsg` over iovecs; partial sends go on from where they
    /// stopped).
    pub async fn send_gather<B: IoBuf>(
        &self,
        g: crate::gather::Gather<B>,
    ) -> (io::Result<()>, crate::gather::Gather<B>) {
        let total = g.len();
        let mut data = (g, self.fd.clone());
        let mut sent = 0usize;
        while sent < total {
            data.0.prepare(sent);
            let (fd, flags) = self.fd.target();
            let entry =
                opcode::SendMsg::new(fd, data.0.msg_ptr()).flags(libc::MSG_NOSIGNAL as u32).build().flags(flags);
            let done = Op::submit(entry, data).await;
            data = done.data;
            match progress(done.res) {
                Ok(n) => sent += n,
                Err(e) => return (Err(e), data.0),
            }
        }
        (Ok(()), data.0)
    }

    /// Shuts the sending direction down: the peer reads end of stream.
    pub fn shutdown_write(&self) -> io::Result<()> {
        // SAFETY: plain syscall on our live descriptor.
        cvt(unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_WR) }).map(drop)
    }

    /// Stops receiving: pending and later receives end (read 0) while the
    /// send side keeps working, so replies still go out.
    pub fn shutdown_read(&self) -> io::Result<()> {
        // SAFETY: plain syscall on our live descriptor.
        cvt(unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RD) }).map(drop)
    }

    /// Shuts both directions down (pending receives end).
    pub fn shutdown(&self) {
        // SAFETY: plain syscall on our live descriptor.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

impl AsRawFd for TcpStream {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
