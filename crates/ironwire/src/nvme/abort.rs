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
//! our replies), a command can be stopped while it waits out a device's
//! injected latency: it is then held here, by CID, and never reaches the
//! backend.

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
    /// Commands waiting out their device's injected latency, by CID (at
    /// most the queue's depth; only devices with injected latency, which
    /// exist for tests, put any here).
    delayed: RefCell<Vec<(u16, Rc<Held>)>>,
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

    /// Stops the command `cid` if it is waiting out an injected latency.
    fn cancel_delay(&self, cid: u16) -> bool {
        let mut delayed = self.delayed.borrow_mut();
        match delayed.iter().position(|(c, _)| *c == cid) {
            Some(i) => {
                let (_, held) = delayed.swap_remove(i);
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
/// those posted for this I/O queue.
fn answer<T: Binding>(conn: &Conn<T>) {
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
                conn.aborts.cancel_delay(cid) || conn.wire.borrow_mut().withdraw_command(cid)
            }
        });
        if let Some(cqe) = cqe {
            conn.failed(cqe.status());
            conn.respond(cqe);
        }
    }
}

/// Waits out `delay` (a device's injected latency) for command `cid`;
/// `false` when the command was aborted meanwhile (it is answered
/// already and must not reach the device).
pub(super) async fn wait_delay<T: Binding>(conn: &Conn<T>, cid: u16, delay: Duration) -> bool {
    let held = Rc::new(Held::default());
    conn.aborts.delayed.borrow_mut().push((cid, held.clone()));
    let _ = reactor::timeout(delay, held.wake.wait()).await;
    if held.aborted.get() {
        return false;
    }
    conn.aborts.delayed.borrow_mut().retain(|(c, _)| *c != cid);
    true
}
