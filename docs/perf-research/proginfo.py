import ctypes, struct, sys, os
libc = ctypes.CDLL(None, use_errno=True)
SYS_bpf = 321
def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 160)
    r = libc.syscall(SYS_bpf, cmd, buf, 160)
    return r, buf
BPF_PROG_GET_NEXT_ID=11; BPF_PROG_GET_FD_BY_ID=13; BPF_OBJ_GET_INFO_BY_FD=15
pid = 0
want = sys.argv[1] if len(sys.argv)>1 else "tk_"
while True:
    r, b = bpf(BPF_PROG_GET_NEXT_ID, struct.pack("II", pid, 0))
    if r < 0: break
    pid = struct.unpack_from("I", b.raw, 4)[0]
    fd, _ = bpf(BPF_PROG_GET_FD_BY_ID, struct.pack("I", pid))
    if fd < 0: continue
    info = ctypes.create_string_buffer(256)
    attr = struct.pack("IIQ", fd, 256, ctypes.addressof(info))
    r, _ = bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    os.close(fd)
    raw = info.raw
    name = raw[64:80].split(b"\0")[0].decode()
    if not name.startswith(want): continue
    xl = struct.unpack_from("I", raw, 20)[0]
    rt, rc = struct.unpack_from("QQ", raw, 192)
    vi = struct.unpack_from("I", raw, 216)[0]
    print(f"{pid} {name} xlated_insns={xl//8} verified_insns={vi} run_cnt={rc} run_time_ns={rt}")
