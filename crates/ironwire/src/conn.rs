//! What every protocol connection driver shares: the wake-up that batches
//! sends, the closing flag, and the writer task that flushes what the
//! sans-IO connection queued.

use reactor::net::TcpStream;
use reactor::Notify;
use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;

/// The I/O side of one connection.
pub struct Shell {
    /// Wakes the writer; notifications before it runs collapse into one
    /// send of everything queued.
    pub tx_ready: Notify,
    closing: Cell<bool>,
    /// The peer, for log lines.
    pub peer: SocketAddr,
}

impl Shell {
    /// A shell for a connection to `peer`.
    pub fn new(peer: SocketAddr) -> Self {
        Shell { tx_ready: Notify::default(), closing: Cell::new(false), peer }
    }

    /// Ends the connection: the writer flushes what is queued, then shuts
    /// the socket down, which ends the reader's pending read.
    pub fn close(&self) {
        if !self.closing.replace(true) {
            self.tx_ready.notify();
        }
    }

    /// Whether the connection is closing.
    pub fn is_closing(&self) -> bool {
        self.closing.get()
    }
}

/// A connection whose queued bytes the writer sends.
pub trait Outbox {
    /// The shell.
    fn shell(&self) -> &Shell;
    /// Moves the queued bytes to the end of `out`.
    fn take_transmit(&self, out: &mut Vec<u8>);
    /// Whether bytes are queued.
    fn has_transmit(&self) -> bool;
}

/// The writer task: one `write_all` per wake-up with everything queued.
pub async fn write_loop<C: Outbox>(wr: TcpStream, conn: Rc<C>) {
    let shell = conn.shell();
    let mut out = Vec::with_capacity(256 * 1024);
    loop {
        shell.tx_ready.wait().await;
        conn.take_transmit(&mut out);
        if !out.is_empty() {
            let (res, o) = wr.write_all(out).await;
            out = o;
            out.clear();
            if res.is_err() {
                shell.closing.set(true);
            }
        }
        if shell.closing.get() && !conn.has_transmit() {
            break;
        }
    }
    // Ends the reader's pending receive.
    wr.shutdown();
}
