//! Listening TCP sockets and their accept queues, from the kernel's `sock_diag` netlink dump
//! (what `ss -lnt` reads): for a listener the kernel reports the connections waiting to be
//! accepted (`idiag_rqueue`, `sk_ack_backlog`) and the backlog in force (`idiag_wqueue`,
//! `sk_max_ack_backlog`: the `listen()` backlog, capped at `net.core.somaxconn` when `listen()`
//! ran). `/proc/net/tcp` shows the first but not the second (its `tx_queue` of a listener is
//! 0), and the backlog is what the fix changes.
//!
//! Packets from `netlink-packet-sock-diag` (typed `inet_diag_req_v2` / `inet_diag_msg`) over a
//! `netlink-sys` socket, both of the rust-netlink project, rather than hand-laid structs. The
//! dump answers within the `recv` calls (the kernel fills each reply as it is read), so it
//! cannot hang on another process; the reply is bounded by the node's listeners.

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_sock_diag::{
    constants::{AF_INET, AF_INET6, IPPROTO_TCP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
    SockDiagMessage,
};
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr};

/// One listening TCP socket of this network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listener {
    pub port: u16,
    /// 4 or 6.
    pub family: u8,
    /// Connections waiting in the accept queue now.
    pub queued: u32,
    /// The accept queue's limit in force: min(`listen()` backlog, `net.core.somaxconn` at
    /// `listen()` time).
    pub backlog: u32,
    pub inode: u32,
}

/// What went wrong asking the kernel for its listeners.
#[derive(Debug, thiserror::Error)]
pub enum ListenersError {
    #[error("sock_diag netlink socket (the interface `ss` uses): {0}")]
    Socket(std::io::Error),
    #[error("sock_diag dump of TCP listeners: the kernel answered error {0}")]
    Kernel(i32),
    #[error("sock_diag dump of TCP listeners: {0}")]
    Decode(String),
}

/// Every listening TCP socket (IPv4 and IPv6) of tracekit's network namespace.
pub fn tcp_listeners() -> Result<Vec<Listener>, ListenersError> {
    let mut out = Vec::new();
    for family in [AF_INET, AF_INET6] {
        dump(family, &mut out)?;
    }
    Ok(out)
}

fn dump(family: u8, out: &mut Vec<Listener>) -> Result<(), ListenersError> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG).map_err(ListenersError::Socket)?;
    socket.bind_auto().map_err(ListenersError::Socket)?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(ListenersError::Socket)?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut request = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::LISTEN,
            socket_id: if family == AF_INET {
                SocketId::new_v4()
            } else {
                SocketId::new_v6()
            },
        })
        .into(),
    );
    request.finalize();
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf);
    socket.send(&buf, 0).map_err(ListenersError::Socket)?;
    let mut reply = vec![0u8; 64 * 1024];
    loop {
        let size = socket
            .recv(&mut &mut reply[..], 0)
            .map_err(ListenersError::Socket)?;
        if size == 0 {
            return Ok(());
        }
        if parse_reply(&reply[..size.min(reply.len())], out)? {
            return Ok(());
        }
    }
}

/// Adds the listeners of one `recv`'s worth of netlink messages to `out`; true at the dump's
/// end.
fn parse_reply(mut bytes: &[u8], out: &mut Vec<Listener>) -> Result<bool, ListenersError> {
    while !bytes.is_empty() {
        let msg = NetlinkMessage::<SockDiagMessage>::deserialize(bytes)
            .map_err(|e| ListenersError::Decode(e.to_string()))?;
        let len = msg.header.length as usize;
        match msg.payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                let h = &r.header;
                out.push(Listener {
                    port: h.socket_id.source_port,
                    family: if h.family == AF_INET6 { 6 } else { 4 },
                    queued: h.recv_queue,
                    backlog: h.send_queue,
                    inode: h.inode,
                });
            }
            NetlinkPayload::Done(_) => return Ok(true),
            NetlinkPayload::Error(e) => {
                return match e.code {
                    None => Ok(true),
                    Some(c) => Err(ListenersError::Kernel(c.get())),
                }
            }
            _ => {}
        }
        // A message shorter than its header, or longer than what is left, ends the batch.
        if len == 0 || len > bytes.len() {
            break;
        }
        bytes = &bytes[len..];
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the real kernel (no root needed): a listener with backlog 7 and two
    /// connections not yet accepted.
    #[test]
    fn a_listeners_queue_and_backlog_are_the_kernels() {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket calls on a descriptor this test owns; the address outlives them.
        let (listener, port) = unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0);
            let mut a: libc::sockaddr_in = std::mem::zeroed();
            a.sin_family = libc::AF_INET as u16;
            a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
            assert_eq!(
                libc::bind(fd, &a as *const _ as *const libc::sockaddr, len),
                0
            );
            assert_eq!(libc::listen(fd, 7), 0);
            let l = std::net::TcpListener::from_raw_fd(fd);
            let port = l.local_addr().unwrap().port();
            (l, port)
        };
        let _a = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _b = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let all = tcp_listeners().unwrap();
        let me: Vec<&Listener> = all.iter().filter(|l| l.port == port).collect();
        assert_eq!(me.len(), 1, "{all:?}");
        let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(me[0].backlog, 7.min(somaxconn));
        assert_eq!(me[0].queued, 2);
        assert_eq!(me[0].family, 4);
        assert!(me[0].inode > 0);
        drop(listener);
    }

    #[test]
    fn truncated_replies_are_errors_not_panics() {
        let mut out = Vec::new();
        assert!(parse_reply(&[0x10, 0, 0, 0, 0x14], &mut out).is_err());
        assert!(out.is_empty());
        assert!(!parse_reply(&[], &mut out).unwrap());
    }
}
