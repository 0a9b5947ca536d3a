//! Abort on the driver's side. Each queue of an NVM controller gets a
//! doorbell once connected (an eventfd whose read is posted on its own
//! reactor's ring) and registers it with the controller's mailbox
//! (`nvmf::Queue::set_abort_doorbell`); one task per queue waits on it, so
//! nothing polls and the I/O path checks nothing. Rung on an I/O queue, the
//! task carries out the Abort requests posted for it; rung on an admin
//! queue, it completes the Aborts its I/O queues answered.
//!
//! Besides what the core and the binding hold (a write waiting for its
//! data, and commands parsed but held back while the host does not read
//! our replies), a command can be stopped while it waits before reaching
//! the device: out a device's injected latency, for room in the
//! connection's read budget, or for the LBA range lock of a fused Compare
//! and Write. It is then watched here, by CID ([`on_abort`]), and an Abort
//! ends the wait.

use super::{Binding, Conn};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// A connection's part in Aborts.
#[derive(Default)]
pub(super) struct Aborts {
    /// Rings this connection's doorbell; taken at close to end its task.
    ringer: RefCell<Option<reactor::Ringer>>,
    /// Commands waiting where an Abort can stop them, by CID (at most the
    /// queue's depth: an injected latency, which only test devices have, a
    /// read waiting for read budget, or a fused Compare and Write waiting
    /// for its range).
    watched: RefCell<Vec<(u16, Rc<Held>)>>,
}

#[derive(Default)]
struct Held {
    aborted: Cell<bool>,
    wake: reactor::Notify,
}

impl Aborts {
    /// The connection is closing: ends its doorbell task.
    pub(super) fn stop(&self) {
        if let Some(r) = self.ringer.borrow_mut().take() {
            r.ring();
        }
    }

    /// Stops the command `cid` if it is watched ([`on_abort`]).
    fn cancel_watched(&self, cid: u16) -> bool {
        let mut watched = self.watched.borrow_mut();
        match watched.iter().position(|(c, _)| *c == cid) {
            Some(i) => {
                let (_, held) = watched.swap_remove(i);
                held.aborted.set(true);
                held.wake.notify();
                true
            }
            None => false,
        }
    }
}

/// Gives a connected queue of an NVM controller its doorbell and the task
/// that answers it.
pub(super) fn start<T: Binding>(conn: &Rc<Conn<T>>) {
    let (bell, ringer) = match reactor::doorbell() {
        Ok(pair) => pair,
        Err(e) => {
            log::warn!("{}: no doorbell for Aborts ({e}); they are answered \"not aborted\"", conn.shell.peer);
            return;
        }
    };
    let ring = ringer.clone();
    conn.queue.borrow_mut().set_abort_doorbell(Arc::new(move || ring.ring()));
    *conn.aborts.ringer.borrow_mut() = Some(ringer);
    let conn = conn.clone();
    reactor::spawn(async move {
        while bell.wait().await.is_ok() && !conn.shell.is_closing() {
            answer(&conn);
        }
    });
}

/// Completes the Aborts answered for this admin queue, and carries out
/// those posted for this I/O queue; lets go of removed namespaces (the
/// other reason a queue is rung).
fn answer<T: Binding>(conn: &Conn<T>) {
    conn.queue.borrow_mut().refresh_namespaces();
    // A fused Compare held on a removed namespace ends there.
    conn.respond_extra();
    loop {
        let cqe = conn.queue.borrow_mut().poll_abort_answer();
        let Some(cqe) = cqe else { break };
        conn.respond(cqe);
    }
    loop {
        let req = conn.queue.borrow_mut().poll_abort();
        let Some(req) = req else { break };
        let cqe = conn.queue.borrow_mut().abort(req, |cid, awaiting_data| {
            if awaiting_data {
                conn.wire.borrow_mut().cancel_data(cid)
            } else {
                conn.aborts.cancel_watched(cid) || conn.wire.borrow_mut().withdraw_command(cid)
            }
        });
        if let Some(cqe) = cqe {
            conn.failed(cqe.status());
            conn.respond(cqe);
        }
        // The partner of an aborted fused half, if it ended with it.
        conn.respond_extra();
    }
}

/// Watches command `cid` for an Abort: the future ends once an Abort
/// stopped the command (and answered it). Until then, and once it is
/// dropped, the command is no longer watched: race it against the wait
/// an Abort may end ([`reactor::race`], with this first), and the Abort
/// either ends the wait or finds nothing to stop.
pub(super) fn on_abort<T: Binding>(conn: &Conn<T>, cid: u16) -> impl std::future::Future<Output = ()> + '_ {
    let held = Rc::new(Held::default());
    conn.aborts.watched.borrow_mut().push((cid, held.clone()));
    let watch = Watch { aborts: &conn.aborts, held };
    async move {
        while !watch.held.aborted.get() {
            watch.held.wake.wait().await;
        }
    }
}

/// A command's entry among the watched; removed when dropped.
struct Watch<'a> {
    aborts: &'a Aborts,
    held: Rc<Held>,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.aborts.watched.borrow_mut().retain(|(_, h)| !Rc::ptr_eq(h, &self.held));
    }
}

/// Waits out `delay` (a device's injected latency) for command `cid`;
/// `false` when the command was aborted meanwhile (it is answered
/// already and must not reach the device).
pub(super) async fn wait_delay<T: Binding>(conn: &Conn<T>, cid: u16, delay: Duration) -> bool {
    reactor::race(on_abort(conn, cid), reactor::sleep(delay)).await.is_err()
}

/// Holds `len` bytes of the connection's read budget for command `cid`
/// ([`crate::conn::hold_read`]), watched for an Abort only when it has to
/// wait for room. `None` when the command was aborted meanwhile (it is
/// answered already) or the connection is closing: it must not reach the
/// device.
pub(super) async fn hold_read<T: Binding>(conn: &Conn<T>, cid: u16, len: usize) -> Option<crate::conn::ReadHold<'_>> {
    if let Some(held) = crate::conn::try_hold_read(conn, len) {
        return Some(held);
    }
    reactor::race(on_abort(conn, cid), crate::conn::hold_read(conn, len)).await.err().flatten()
}
