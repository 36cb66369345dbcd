//! [`MetadataServer`]: a server of Mooncake's HTTP metadata protocol, so that a cluster
//! that names one (`http://host:port/metadata`) needs no Mooncake install.

use crate::error::{Error, Result};
use crate::metadata::lock;
use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tiny_http::{Method, Request, Response};

/// The largest value stored (a larger PUT is answered 413).
pub(crate) const MAX_VALUE: usize = 64 << 20;

/// The most keys stored (a PUT of one more is answered 507).
pub(crate) const MAX_KEYS: usize = 1 << 20;

/// The most bytes of values stored in all (a PUT past it is answered 507).
pub(crate) const MAX_BYTES: usize = 1 << 30;

/// The most PUT bodies read at once, each on its own thread (one more is answered 503), so
/// that a client that sends its body slowly holds one of them, not the server.
pub(crate) const MAX_UPLOADS: usize = 16;

/// The values, and their bytes in all.
#[derive(Default)]
struct Store {
    map: HashMap<String, Vec<u8>>,
    bytes: usize,
}

/// A server of Mooncake's HTTP metadata protocol (see [`HttpMetadata`](crate::HttpMetadata))
/// at `http://<addr>/metadata`, in memory, answering as Mooncake's own server does:
/// `GET` 200 with the value or 404, `PUT` 200 (400 for a second value of a key holding
/// `rpc_meta`, which Mooncake's engines keep unique), `DELETE` 200 or 404, 400 without a
/// key, 405 for other methods. Values are at most 64 MiB (413), keys at most 2^20 and values
/// at most 1 GiB in all (507); at most 16 PUT bodies are read at once, each on its own
/// thread (503 past them). It runs until dropped.
///
/// Like Mooncake's, it is meant for the cluster's own network: anyone who reaches it can
/// store and delete values (agents refuse values no agent of the cluster signed, so the
/// harm is to availability), and each connection holds a thread of the HTTP library while
/// open.
pub struct MetadataServer {
    http: Arc<tiny_http::Server>,
    addr: SocketAddr,
    store: Arc<Mutex<Store>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetadataServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl MetadataServer {
    /// Listens on `bind` (port 0: any free port) and serves until dropped.
    ///
    /// # Errors
    /// [`Error::Io`] when the address cannot be bound or the thread cannot start.
    pub fn start(bind: SocketAddr) -> Result<MetadataServer> {
        let http = tiny_http::Server::http(bind).map_err(|e| Error::Io {
            op: "bind the HTTP metadata server to",
            addr: bind.to_string(),
            detail: e.to_string(),
        })?;
        let addr = http.server_addr().to_ip().unwrap_or(bind);
        let http = Arc::new(http);
        let store = Arc::new(Mutex::new(Store::default()));
        let (h, s) = (http.clone(), store.clone());
        let uploads = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new()
            .name("http-metadata".into())
            .spawn(move || {
                for req in h.incoming_requests() {
                    dispatch(&s, &uploads, req);
                }
            })
            .map_err(|e| Error::io("start the HTTP metadata server's thread on", addr, e))?;
        Ok(MetadataServer {
            http,
            addr,
            store,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its URL, `http://<addr>/metadata`: what agents and Mooncake's engines are given.
    pub fn url(&self) -> String {
        format!("http://{}/metadata", self.addr)
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        lock(&self.store).map.len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for MetadataServer {
    /// Stops serving: the listener closes and the thread ends.
    fn drop(&mut self) {
        self.http.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The `key` of a request's query string, trimmed (as Mooncake's server reads it).
fn key_of(url: &str) -> Option<String> {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "key")
        .map(|(_, v)| v.trim().to_string())
}

fn answer(req: Request, status: u16, body: impl Into<Vec<u8>>) {
    let r = Response::from_data(body.into()).with_status_code(status);
    // A client that went away has no one to tell.
    let _ = req.respond(r);
}

/// Serves `req`: a PUT on a thread of its own (its body may come slowly), the rest here.
fn dispatch(store: &Arc<Mutex<Store>>, uploads: &Arc<AtomicUsize>, req: Request) {
    if *req.method() != Method::Put {
        return serve(store, req);
    }
    if uploads.fetch_add(1, Ordering::AcqRel) >= MAX_UPLOADS {
        uploads.fetch_sub(1, Ordering::AcqRel);
        return answer(req, 503, "too many uploads at once");
    }
    let (s, u) = (store.clone(), uploads.clone());
    let spawned = std::thread::Builder::new()
        .name("http-metadata-put".into())
        .spawn(move || {
            serve(&s, req);
            u.fetch_sub(1, Ordering::AcqRel);
        });
    if spawned.is_err() {
        // The request went with the closure: its client sees the connection close.
        uploads.fetch_sub(1, Ordering::AcqRel);
    }
}

fn serve(store: &Mutex<Store>, mut req: Request) {
    if req.url().split('?').next() != Some("/metadata") {
        return answer(req, 404, "not found");
    }
    let key = match key_of(req.url()) {
        Some(k) if !k.is_empty() => k,
        _ => return answer(req, 400, "metadata key is required"),
    };
    match req.method() {
        Method::Get => match lock(store).map.get(&key).cloned() {
            Some(v) => answer(req, 200, v),
            None => answer(req, 404, "metadata not found"),
        },
        Method::Put => {
            if req.body_length().is_some_and(|n| n > MAX_VALUE) {
                return answer(req, 413, "metadata value too large");
            }
            let mut value = Vec::new();
            let read = req
                .as_reader()
                .take(MAX_VALUE as u64 + 1)
                .read_to_end(&mut value);
            if read.is_err() {
                return answer(req, 400, "metadata value could not be read");
            }
            if value.len() > MAX_VALUE {
                return answer(req, 413, "metadata value too large");
            }
            let refusal = put(&mut lock(store), key, value);
            match refusal {
                None => answer(req, 200, "metadata updated"),
                Some((status, why)) => answer(req, status, why),
            }
        }
        Method::Delete => {
            let mut s = lock(store);
            match s.map.remove(&key) {
                Some(v) => {
                    s.bytes -= v.len();
                    drop(s);
                    answer(req, 200, "metadata deleted")
                }
                None => {
                    drop(s);
                    answer(req, 404, "metadata not found")
                }
            }
        }
        _ => answer(req, 405, "Method not allowed"),
    }
}

/// Stores `value` under `key`, or the status and text that refuse it.
fn put(s: &mut Store, key: String, value: Vec<u8>) -> Option<(u16, &'static str)> {
    let old = s.map.get(&key).map_or(0, Vec::len);
    if key.contains("rpc_meta") && s.map.contains_key(&key) {
        return Some((400, "Duplicate rpc_meta key not allowed"));
    }
    if !s.map.contains_key(&key) && s.map.len() >= MAX_KEYS {
        return Some((507, "metadata server full (keys)"));
    }
    if s.bytes - old + value.len() > MAX_BYTES {
        return Some((507, "metadata server full (bytes)"));
    }
    s.bytes = s.bytes - old + value.len();
    s.map.insert(key, value);
    None
}
