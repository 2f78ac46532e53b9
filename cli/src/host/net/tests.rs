use super::*;

#[test]
fn softnet_new_and_old_layouts() {
    let new = "\
0000000b 00000002 00000001 00000000 00000000 00000000 00000000 00000000 00000000 00000005 00000000 00000000 00000000 00000000 00000000
0000210d 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000003 00000000 00000000
";
    let s = parse_softnet(new);
    assert_eq!(s.len(), 2);
    assert_eq!(
        (s[0].cpu, s[0].processed, s[0].dropped, s[0].time_squeeze),
        (0, 11, 2, 1)
    );
    assert_eq!(s[0].received_rps, 5);
    assert_eq!((s[1].cpu, s[1].processed), (3, 0x210d));
    let old = "00000010 00000000 00000001 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000\n";
    assert_eq!(parse_softnet(old)[0].cpu, 0);
    assert!(parse_softnet("zz\n").is_empty());
    let a = Softnet {
        processed: 0xffff_fff0,
        ..Default::default()
    };
    let b = Softnet {
        processed: 0x10,
        ..Default::default()
    };
    assert_eq!(b.since(&a).processed, 0x20, "32-bit counters wrap");
}

#[test]
fn snmp_pairs() {
    let t = "\
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors
Udp: 10 1300000 5 9 1360000
Tcp: RtoAlgorithm MaxConn
Tcp: 1 -1
Broken: a b
";
    let m = parse_counter_pairs(t);
    assert_eq!(m["Udp:NoPorts"], 1_300_000);
    assert_eq!(m["Udp:RcvbufErrors"], 1_360_000);
    assert_eq!(m["Tcp:MaxConn"], -1);
    assert!(!m.keys().any(|k| k.starts_with("Broken")));
}

#[test]
fn snmp6_lines() {
    let t = "Ip6InReceives                   \t120\nUdp6InDatagrams                 \t7\nUdpLite6InDatagrams             \t0\nUdp6RcvbufErrors 3\nIcmp6OutType133 2\nodd\nBad x\n";
    let m = parse_snmp6(t);
    assert_eq!(m["Ip6:InReceives"], 120);
    assert_eq!(m["Udp6:InDatagrams"], 7);
    assert_eq!(m["UdpLite6:InDatagrams"], 0);
    assert_eq!(m["Udp6:RcvbufErrors"], 3);
    assert_eq!(m["Icmp6:OutType133"], 2);
    assert_eq!(m.len(), 5);
}

#[test]
fn conntrack_columns_summed() {
    let t = "entries  clashres found drop insert_failed\n0000000a 00000001 00000000 00000002 00000003\n0000000a 00000001 00000000 00000004 00000000\n";
    let m = parse_conntrack_stat(t);
    assert_eq!(m["drop"], 6);
    assert_eq!(m["insert_failed"], 3);
    assert!(!m.contains_key("entries"));
}

#[test]
fn interrupts_per_cpu_and_names() {
    let t = "           CPU0       CPU1\n 24:          1          0  IO-APIC   5-edge      ACPI:Ged\n 30:       900         12  PCI-MSIX-0000:00:03.0   1-edge      virtio0-input.0\nNMI:          0          0   Non-maskable interrupts\n";
    let v = parse_interrupts(t);
    assert_eq!(v.len(), 2);
    assert_eq!(v[1].irq, 30);
    assert_eq!(v[1].per_cpu, [900, 12]);
    assert_eq!(v[1].name, "virtio0-input.0");
}

#[test]
fn reads_this_machine() {
    assert!(!softnet().unwrap().is_empty());
    let c = protocol_counters().unwrap();
    assert!(c.contains_key("Udp:NoPorts"), "{c:?}");
    assert!(device_counters().contains_key(OsStr::new("lo")));
}

#[test]
fn socket_tables_and_masks() {
    let udp = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  123: 0100007F:9C40 00000000:0000 07 00000000:00000900 00:00000000 00000000     0        0 45678 2 0000000000000000 19999
  124: 00000000:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 45679 2 0000000000000000 0
";
    let v = parse_socket_table(udp);
    assert_eq!(v.len(), 2);
    assert_eq!(
        v[0],
        SockEntry {
            port: 0x9c40,
            state: 7,
            rx_queue: 0x900,
            inode: 45678,
            drops: Some(19999)
        }
    );
    assert_eq!(v[1].port, 53);
    let tcp6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2112 1 0000000000000000 100 0 0 10 0
";
    let t = parse_socket_table(tcp6);
    assert_eq!((t[0].port, t[0].state, t[0].inode), (22, 0x0a, 2112));
    assert_eq!(parse_cpu_mask("0").unwrap(), Vec::<u32>::new());
    assert_eq!(parse_cpu_mask("00000001,00000005").unwrap(), [0, 2, 32]);
    assert!(parse_cpu_mask("zz").is_none());
    assert!(irq_is_device("virtio2-input.0", "eth0", Some("virtio2")));
    assert!(!irq_is_device("virtio20-input.0", "eth0", Some("virtio2")));
    assert!(irq_is_device("eth0-rx-3", "eth0", None));
    assert!(irq_is_device(
        "mlx5_comp3@pci:0000:03:00.0",
        "ens1",
        Some("0000:03:00.0")
    ));
    assert!(!irq_is_device("eth01-rx-0", "eth0", None));
}

#[test]
fn this_machine_has_loopback_and_sockets() {
    let ifs = interfaces();
    assert_eq!(ifs.get(&1).map(OsString::as_os_str), Some(OsStr::new("lo")));
    // Loopback has no ring and no channels: the ioctl says so without an error.
    assert_eq!(ring("lo"), None);
    assert_eq!(ring("no-such-device-x"), None);
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = s.local_addr().unwrap().port();
    let socks = port_sockets("udp", port);
    assert_eq!(socks.len(), 1, "{socks:?}");
    let owners = socket_owners(&[socks[0].inode]);
    assert_eq!(owners[&socks[0].inode], [std::process::id()]);
}
