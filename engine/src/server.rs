//! The control listener: answers peers' requests for the agent's descriptor and
//! incarnation, makes the agent's side of their queue pairs, and takes their notifications.
//!
//! One thread accepts; one thread per connection serves it and holds the queue pairs made
//! over it, which are destroyed when the connection ends (the peer closed it or died).

use crate::batch::{Notification, MAX_NOTIFICATION};
use crate::error::{Error, Result};
use crate::metadata::lock;
use crate::shared::Shared;
use crate::wire::{read_frame, write_frame, Reply, Request};
use rdma_dmabuf::{Endpoint, QueuePair};
use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

type Conns = Arc<Mutex<HashMap<u64, TcpStream>>>;

/// The running listener; dropping it stops it and ends every connection.
pub(crate) struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Conns,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start(shared: Arc<Shared>, listener: TcpListener) -> Result<Server> {
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("read the address of", "the listener", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Conns = Arc::default();
        let (s, c) = (stop.clone(), conns.clone());
        let accept = std::thread::Builder::new()
            .name(format!("{}-listen", shared.name))
            .spawn(move || accept_loop(&shared, &listener, &s, &c))
            .map_err(|e| Error::io("start the listener thread for", addr, e))?;
        Ok(Server {
            addr,
            stop,
            conns,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip([127, 0, 0, 1].into());
        }
        // A connection wakes the blocking accept, which then sees `stop`.
        let _ = TcpStream::connect_timeout(&wake, std::time::Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for s in lock(&self.conns).values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener, stop: &AtomicBool, conns: &Conns) {
    let mut next = 0u64;
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let _ = stream.set_nodelay(true);
        next += 1;
        let id = next;
        if let Ok(copy) = stream.try_clone() {
            lock(conns).insert(id, copy);
        }
        let conns_for_err = conns.clone();
        let (shared, conns) = (shared.clone(), conns.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("{}-peer", shared.name))
            .spawn(move || {
                serve(&shared, stream);
                lock(&conns).remove(&id);
            });
        if spawned.is_err() {
            lock(&conns_for_err).remove(&id);
        }
    }
}

/// Serves one connection until it ends; the queue pairs made over it live as long.
fn serve(shared: &Shared, mut stream: TcpStream) {
    let mut qps: Vec<QueuePair> = Vec::new();
    while let Ok(frame) = read_frame(&mut stream) {
        let reply = match Request::decode(&frame) {
            Ok(req) => answer(shared, req, &mut qps),
            Err(e) => Reply::Refused(e.to_string()),
        };
        if write_frame(&mut stream, &reply.encode()).is_err() {
            break;
        }
    }
}

fn answer(shared: &Shared, req: Request, qps: &mut Vec<QueuePair>) -> Reply {
    match req {
        Request::Describe => Reply::Descriptor(shared.descriptor().to_bytes()),
        Request::Check => Reply::Incarnation(shared.incarnation),
        Request::Connect { device, endpoint } => match accept_qp(shared, device, &endpoint) {
            Ok((qp, mine)) => {
                qps.push(qp);
                Reply::Connected(mine)
            }
            Err(e) => Reply::Refused(e.to_string()),
        },
        Request::Notify { from, message } if message.len() <= MAX_NOTIFICATION => {
            shared.deliver(Notification { from, message });
            Reply::Noted
        }
        Request::Notify { message, .. } => {
            Reply::Refused(Error::NotificationTooLong(message.len()).to_string())
        }
        Request::Release { qpns } => {
            let before = qps.len();
            qps.retain(|q| !qpns.contains(&q.endpoint().qpn));
            Reply::Released((before - qps.len()) as u32)
        }
    }
}

/// This agent's queue pair on `device`, connected to the peer's `endpoint`.
fn accept_qp(shared: &Shared, device: u16, endpoint: &Endpoint) -> Result<(QueuePair, Endpoint)> {
    let d = usize::from(device);
    if d >= shared.devices.len() {
        return Err(Error::Protocol(format!("no device {device}")));
    }
    let fail = |e: rdma_dmabuf::Error| Error::rdma("accept a queue pair", &e);
    let prepared = shared.qp_builder(d).build().map_err(fail)?;
    let mine = prepared.endpoint();
    Ok((prepared.connect(endpoint).map_err(fail)?, mine))
}
