//! What every protocol connection driver shares: the wake-up that batches
//! sends, the closing flag, the writer task that flushes what the sans-IO
//! connection queued, and the send high-water mark that stops a connection
//! from reading while its peer does not read our replies.

use reactor::buf::IoBuf;
use reactor::gather::Gather;
use reactor::net::TcpStream;
use reactor::{Notify, Receiver};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Poll, Waker};

/// Bytes of replies a connection may have queued or in its socket send
/// before it stops reading the peer's commands: a peer that does not read
/// costs at most this (plus what its outstanding commands produce) and
/// never holds the reactor's shared receive buffers. `[limits]
/// send_high_water`, set once at start.
static SEND_HIGH_WATER: AtomicUsize = AtomicUsize::new(4 << 20);

/// Sets the send high-water mark for every connection.
pub fn set_send_high_water(bytes: usize) {
    SEND_HIGH_WATER.store(bytes, Ordering::Relaxed);
}

/// Bytes of read data a connection may hold at once: the buffers of its
/// reads that run as I/O tasks (file and block devices; memory devices
/// only with injected latency or answers of several PDUs), plus its
/// replies queued or being sent. A read that would pass it waits for room,
/// in arrival order, so a peer that sends a queue's depth of large reads
/// and does not read the data costs this (and at most one read more), not
/// depth × transfer size. A read goes through whatever its size once the
/// connection holds no other read and at most half the budget in replies.
/// `[limits] read_budget`, set once at start.
static READ_BUDGET: AtomicUsize = AtomicUsize::new(8 << 20);

/// Sets the read budget for every connection.
pub fn set_read_budget(bytes: usize) {
    READ_BUDGET.store(bytes, Ordering::Relaxed);
}

/// The I/O side of one connection.
pub struct Shell {
    /// Wakes the writer; notifications before it runs collapse into one
    /// send of everything queued.
    pub tx_ready: Notify,
    /// Bytes the writer is sending now.
    sending: Cell<usize>,
    /// Wakes a reader waiting for the writer to make room.
    drained: Notify,
    /// Bytes of read buffers held by this connection's running reads.
    read_held: Cell<usize>,
    /// Reads waiting for read budget ([`hold_read`]), by ticket in arrival
    /// order (tickets only grow), each with its task's waker while it
    /// sleeps. Only the head of
    /// the line can go, so only it is woken (by the writer's progress, a
    /// read's end, the head before it leaving), and a peer's thousand
    /// waiting reads cost one wake-up per event, not a thousand; closing
    /// wakes them all.
    read_line: RefCell<VecDeque<(u64, Option<Waker>)>>,
    read_tickets: Cell<u64>,
    closing: Cell<bool>,
    /// Commands running as I/O tasks.
    io: Cell<usize>,
    /// Wakes [`Shell::io_finished`] when the last I/O task ends.
    io_idle: Notify,
    /// The peer, for log lines.
    pub peer: SocketAddr,
}

/// One running I/O task of a connection; [`Shell::io_finished`] waits
/// until none is left.
pub struct IoTask<'a>(&'a Shell);

impl Drop for IoTask<'_> {
    fn drop(&mut self) {
        let left = self.0.io.get().saturating_sub(1);
        self.0.io.set(left);
        if left == 0 {
            self.0.io_idle.notify();
        }
    }
}

impl Shell {
    /// A shell for a connection to `peer`.
    pub fn new(peer: SocketAddr) -> Self {
        Shell {
            tx_ready: Notify::default(),
            sending: Cell::new(0),
            drained: Notify::default(),
            read_held: Cell::new(0),
            read_line: RefCell::new(VecDeque::new()),
            read_tickets: Cell::new(0),
            closing: Cell::new(false),
            io: Cell::new(0),
            io_idle: Notify::default(),
            peer,
        }
    }

    /// Ends the connection: the writer flushes what is queued, then shuts
    /// the socket down, which ends the reader's pending read.
    pub fn close(&self) {
        if !self.closing.replace(true) {
            self.tx_ready.notify();
            self.drained.notify();
            let wakers: Vec<Waker> = self.read_line.borrow_mut().iter_mut().filter_map(|(_, w)| w.take()).collect();
            wakers.into_iter().for_each(Waker::wake);
        }
    }

    /// Whether the connection is closing.
    pub fn is_closing(&self) -> bool {
        self.closing.get()
    }

    /// Counts an I/O task as running until the guard drops.
    pub fn io_task(&self) -> IoTask<'_> {
        self.io.set(self.io.get() + 1);
        IoTask(self)
    }

    /// Waits until no I/O task of this connection is running, so that its
    /// answers are queued before the connection closes and the backend
    /// work is done before the connection's place is given back.
    pub async fn io_finished(&self) {
        while self.io.get() > 0 {
            self.io_idle.wait().await;
        }
    }
}

/// A connection whose queued bytes the writer sends.
pub trait Outbox {
    /// Buffers whose bytes are sent from where they lie (a device's I/O
    /// buffer), spliced between the queued bytes.
    type Spliced: IoBuf;
    /// The shell.
    fn shell(&self) -> &Shell;
    /// Moves what is queued to the end of `out`.
    fn take_transmit(&self, out: &mut Gather<Self::Spliced>);
    /// How many bytes are queued.
    fn queued(&self) -> usize;
}

/// Read data held by one read ([`hold_read`]) until it drops: by then the
/// data is queued for sending, or dropped.
pub struct ReadHold<'a> {
    shell: &'a Shell,
    len: usize,
}

impl Drop for ReadHold<'_> {
    fn drop(&mut self) {
        self.shell.read_held.set(self.shell.read_held.get().saturating_sub(self.len));
        self.shell.room_for_reads();
    }
}

impl Shell {
    /// Wakes the read at the head of the line for read budget, if it
    /// sleeps: the only one that may go.
    fn room_for_reads(&self) {
        let head = self.read_line.borrow_mut().front_mut().and_then(|(_, w)| w.take());
        if let Some(w) = head {
            w.wake();
        }
    }

    /// Sleeps until the read holding `ticket` in the line is woken (it
    /// became the head, room was made while it is, or the connection is
    /// closing) or its task is polled for another reason; the caller
    /// checks again either way.
    async fn sleep_in_line(&self, ticket: u64) {
        let mut slept = false;
        std::future::poll_fn(|cx| {
            if std::mem::replace(&mut slept, true) {
                return Poll::Ready(());
            }
            let mut line = self.read_line.borrow_mut();
            // Tickets grow along the line: a binary search finds its place
            // (a thousand waiting reads re-polled by their fence watches
            // would make a scan quadratic).
            if let Ok(i) = line.binary_search_by_key(&ticket, |&(t, _)| t) {
                if let Some((_, waker)) = line.get_mut(i) {
                    *waker = Some(cx.waker().clone());
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Counts `len` bytes of read data held until the guard drops.
    fn hold(&self, len: usize) -> ReadHold<'_> {
        self.read_held.set(self.read_held.get().saturating_add(len));
        ReadHold { shell: self, len }
    }
}

/// A read's place in its connection's line for read budget; leaving it
/// (admitted, or the read dropped while it waits: aborted, connection
/// closing) lets the next one check.
struct InLine<'a> {
    shell: &'a Shell,
    ticket: u64,
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        let mut line = self.shell.read_line.borrow_mut();
        if let Ok(i) = line.binary_search_by_key(&self.ticket, |&(t, _)| t) {
            line.remove(i);
        }
        drop(line);
        self.shell.room_for_reads();
    }
}

/// Whether a read of `len` bytes fits the connection's read budget now:
/// reads held plus replies queued or being sent, or no other read held and
/// at most half the budget in replies. The second rule lets a read larger
/// than the room left (or than the whole budget) go without waiting for
/// every reply to be sent: other replies (write responses, R2Ts, NOP-Ins)
/// may keep coming, and the reads behind it in line wait for it. It costs
/// at most one read beyond half the budget.
fn fits<C: Outbox>(conn: &C, len: usize) -> bool {
    let shell = conn.shell();
    let held = shell.read_held.get();
    let replies = conn.queued().saturating_add(shell.sending.get());
    let budget = READ_BUDGET.load(Ordering::Relaxed);
    held.saturating_add(replies).saturating_add(len) <= budget || (held == 0 && replies <= budget / 2)
}

/// Holds a read of `len` bytes against the connection's read budget
/// ([`READ_BUDGET`]) when it fits now and no read waits before it; `None`
/// when it would have to wait ([`hold_read`] waits) or the connection is
/// closing.
pub fn try_hold_read<C: Outbox>(conn: &C, len: usize) -> Option<ReadHold<'_>> {
    let shell = conn.shell();
    (!shell.is_closing() && shell.read_line.borrow().is_empty() && fits(conn, len)).then(|| shell.hold(len))
}

/// Waits until a read of `len` bytes fits the connection's read budget
/// ([`READ_BUDGET`]: reads held plus replies queued or being sent), then
/// holds its bytes until the returned guard drops. Reads that wait go in
/// arrival order: a large read is not passed by the small ones that come
/// after it. A read goes through whatever its size when no other read is
/// held and at most half the budget is in replies ([`fits`]). `None` once
/// the connection is closing: nobody will take the data, and letting every
/// waiting read through then would allocate what the budget held back (a
/// peer can close at will); the caller drops the command.
pub async fn hold_read<C: Outbox>(conn: &C, len: usize) -> Option<ReadHold<'_>> {
    if let Some(held) = try_hold_read(conn, len) {
        return Some(held);
    }
    let shell = conn.shell();
    let ticket = shell.read_tickets.get();
    shell.read_tickets.set(ticket.wrapping_add(1));
    shell.read_line.borrow_mut().push_back((ticket, None));
    let place = InLine { shell, ticket };
    loop {
        if shell.is_closing() {
            return None;
        }
        if shell.read_line.borrow().front().map(|&(t, _)| t) == Some(ticket) && fits(conn, len) {
            break;
        }
        shell.tx_ready.notify();
        shell.sleep_in_line(ticket).await;
    }
    drop(place);
    Some(shell.hold(len))
}

/// Whether the connection's replies (queued, and being sent) passed
/// [`SEND_HIGH_WATER`]: its driver must stop dispatching commands.
pub fn over_high_water<C: Outbox>(conn: &C) -> bool {
    conn.queued().saturating_add(conn.shell().sending.get()) > SEND_HIGH_WATER.load(Ordering::Relaxed)
}

/// Waits, not reading, until the peer took enough of our replies for the
/// connection to be under [`SEND_HIGH_WATER`] again (or it closes). The
/// parked receive gives the reactor's shared buffers back to the others
/// (what it had taken waits in a copy of its own).
pub async fn wait_for_room<C: Outbox>(conn: &C, rx: &mut Receiver) {
    let shell = conn.shell();
    let mut logged = false;
    while over_high_water(conn) && !shell.is_closing() {
        if !logged {
            log::debug!("{}: peer is not reading our replies; pausing its commands", shell.peer);
            logged = true;
        }
        rx.park().await;
        shell.tx_ready.notify();
        shell.drained.wait().await;
    }
}

/// Splices one send of a connection that splices at all has room for from
/// the first (no growth while it runs, the allocation test's rule): a
/// batch of up to 512 reads sent from their buffers or from the page of
/// zeros.
const SPLICE_ROOM: usize = 512;

/// What a connection's send batch starts with: it grows to the largest
/// batch the connection sends (by doubling, during its first busy
/// moments) and keeps that room. Starting small keeps an idle connection
/// small in address space too, not only in touched pages: with
/// transparent huge pages always on, khugepaged fills a mostly untouched
/// reservation (256 KiB per connection before) with resident memory.
const SEND_BATCH_START: usize = 4096;

/// The writer task: one send per wake-up with everything queued (a
/// `sendmsg` over iovecs when buffers are spliced in, else one `send`).
pub async fn write_loop<C: Outbox>(wr: TcpStream, conn: Rc<C>) {
    let shell = conn.shell();
    let mut out = Gather::with_capacity(SEND_BATCH_START);
    loop {
        shell.tx_ready.wait().await;
        conn.take_transmit(&mut out);
        if !out.splices.is_empty() && out.splices.capacity() < SPLICE_ROOM {
            out.reserve_splices(SPLICE_ROOM);
        }
        if !out.is_empty() {
            shell.sending.set(out.len());
            let res = if out.splices.is_empty() {
                let (res, head) = wr.write_all(std::mem::take(&mut out.head)).await;
                out.head = head;
                res
            } else {
                let (res, o) = wr.send_gather(out).await;
                out = o;
                res
            };
            out.clear();
            shell.sending.set(0);
            shell.drained.notify();
            shell.room_for_reads();
            if res.is_err() {
                shell.closing.set(true);
            }
        }
        if shell.closing.get() && conn.queued() == 0 {
            break;
        }
    }
    // Ends the reader's pending receive.
    wr.shutdown();
}

#[cfg(test)]
mod tests {
    use super::*;
    use reactor::NotifyAll;
    use std::time::Duration;

    /// A connection whose replies queued are set by the test.
    struct Quiet(Shell, Cell<usize>);

    impl Outbox for Quiet {
        type Spliced = Vec<u8>;
        fn shell(&self) -> &Shell {
            &self.0
        }
        fn take_transmit(&self, _: &mut Gather<Vec<u8>>) {}
        fn queued(&self) -> usize {
            self.1.get()
        }
    }

    const MIB: usize = 1 << 20;

    fn quiet() -> Rc<Quiet> {
        Rc::new(Quiet(Shell::new(SocketAddr::from(([127, 0, 0, 1], 1))), Cell::new(0)))
    }

    /// Spawns a read of `len` bytes that records `name` in `order` once it
    /// holds its budget, and keeps it until `release` is notified.
    fn read(
        conn: &Rc<Quiet>,
        len: usize,
        name: &'static str,
        order: &Rc<RefCell<Vec<&'static str>>>,
        release: &Rc<NotifyAll>,
    ) -> reactor::JoinHandle<bool> {
        let (conn, order, release) = (conn.clone(), order.clone(), release.clone());
        reactor::spawn(async move {
            let Some(_held) = hold_read(&*conn, len).await else { return false };
            order.borrow_mut().push(name);
            release.wait().await;
            true
        })
    }

    async fn settle() {
        for _ in 0..10 {
            reactor::yield_now().await;
        }
    }

    #[test]
    fn reads_waiting_for_budget_go_in_arrival_order() {
        let mut rt = reactor::Runtime::new(reactor::Config::default()).expect("a ring");
        rt.block_on(async {
            let conn = quiet();
            let first = try_hold_read(&*conn, 6 * MIB).expect("an empty budget takes a read");
            let (order, release) = (Rc::new(RefCell::new(Vec::new())), Rc::new(NotifyAll::default()));
            let big = read(&conn, 4 * MIB, "big", &order, &release);
            settle().await;
            assert!(order.borrow().is_empty(), "6 + 4 MiB passes the 8 MiB budget");
            // 6 + 1 MiB would fit, but the big read waits before it.
            assert!(try_hold_read(&*conn, MIB).is_none(), "a small read passed a waiting big one");
            let small = read(&conn, MIB, "small", &order, &release);
            settle().await;
            assert!(order.borrow().is_empty());
            drop(first);
            settle().await;
            assert_eq!(*order.borrow(), ["big", "small"]);
            release.notify();
            assert!(big.await && small.await);
            assert!(try_hold_read(&*conn, 8 * MIB).is_some(), "every hold was given back");
        });
    }

    #[test]
    fn a_read_larger_than_the_room_goes_alone_while_small_replies_keep_coming() {
        let mut rt = reactor::Runtime::new(reactor::Config::default()).expect("a ring");
        rt.block_on(async {
            let conn = quiet();
            // Replies of other commands are always queued.
            conn.1.set(4 << 10);
            let (order, release) = (Rc::new(RefCell::new(Vec::new())), Rc::new(NotifyAll::default()));
            let big = read(&conn, 8 * MIB, "big", &order, &release);
            let small = read(&conn, 64 << 10, "small", &order, &release);
            settle().await;
            assert_eq!(*order.borrow(), ["big"], "no other read held: the big read goes");
            release.notify();
            assert!(big.await);
            settle().await;
            assert_eq!(*order.borrow(), ["big", "small"]);
            release.notify();
            assert!(small.await);
            // More than half the budget in replies: even a lone read waits.
            conn.1.set(5 * MIB);
            let held = read(&conn, 4 * MIB, "past half", &order, &release);
            settle().await;
            assert_eq!(order.borrow().len(), 2, "a lone read went with 5 MiB of replies queued");
            conn.1.set(4 * MIB);
            conn.0.room_for_reads();
            settle().await;
            assert_eq!(order.borrow().last(), Some(&"past half"));
            release.notify();
            assert!(held.await);
        });
    }

    #[test]
    fn only_the_head_of_the_line_is_woken() {
        let mut rt = reactor::Runtime::new(reactor::Config::default()).expect("a ring");
        rt.block_on(async {
            let conn = quiet();
            let first = try_hold_read(&*conn, 6 * MIB).expect("an empty budget takes a read");
            let polls = Rc::new(Cell::new(0usize));
            let waiting: Vec<_> = (0..100)
                .map(|_| {
                    let (conn, polls) = (conn.clone(), polls.clone());
                    reactor::spawn(async move {
                        let mut wait = std::pin::pin!(hold_read(&*conn, 4 * MIB));
                        std::future::poll_fn(|cx| {
                            polls.set(polls.get() + 1);
                            std::future::Future::poll(wait.as_mut(), cx).map(|held| held.is_some())
                        })
                        .await
                    })
                })
                .collect();
            settle().await;
            let before = polls.get();
            assert_eq!(before, 100, "each waiting read polled once, to join the line");
            // Room made 50 times, none enough: the head alone checks.
            for _ in 0..50 {
                conn.0.room_for_reads();
                settle().await;
            }
            assert_eq!(polls.get() - before, 50, "reads behind the head were woken");
            // Closing ends every one of them.
            conn.0.close();
            for w in waiting {
                assert!(!w.await, "a closing connection let a read through");
            }
            drop(first);
        });
    }

    #[test]
    fn a_waiting_read_dropped_lets_the_next_one_go_and_closing_ends_the_rest() {
        let mut rt = reactor::Runtime::new(reactor::Config::default()).expect("a ring");
        rt.block_on(async {
            let conn = quiet();
            let first = try_hold_read(&*conn, 6 * MIB).expect("an empty budget takes a read");
            let (order, release) = (Rc::new(RefCell::new(Vec::new())), Rc::new(NotifyAll::default()));
            // The big read gives up while it waits (an abort drops it).
            let big = reactor::timeout(Duration::from_millis(20), hold_read(&*conn, 4 * MIB));
            let small = read(&conn, MIB, "small", &order, &release);
            assert!(big.await.is_err(), "the big read could not fit");
            settle().await;
            assert_eq!(*order.borrow(), ["small"], "the line moved on when its head left");
            // A read still waiting when the connection closes gets nothing.
            let last = read(&conn, 2 * MIB, "last", &order, &release);
            settle().await;
            conn.0.close();
            assert!(!last.await, "a closing connection let a read through");
            release.notify();
            assert!(small.await);
            drop(first);
            assert_eq!(*order.borrow(), ["small"]);
        });
    }
}
