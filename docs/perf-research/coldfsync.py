import os, sys
path, n, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_WRONLY|os.O_CREAT|os.O_TRUNC, 0o644)
junk = bytearray(mb << 20)
fill = bytes(len(junk[::64]))
blk = b"x" * 4096
for i in range(n):
    os.write(fd, blk)
    if mb:
        junk[::64] = fill   # touch every cache line: evicts L1/L2 and most of the LLC
    os.fsync(fd)
print('{"ok":1}')
