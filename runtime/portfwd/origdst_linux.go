package portfwd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSoOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/
// ip6_tables.h), which golang.org/x/sys does not define; IPv4's
// SO_ORIGINAL_DST has the same value.
const ip6tSoOriginalDst = 80

// originalPort is the port that the client of c dialed before a REDIRECT
// rule sent it to the listener: the destination of the connection's
// original direction in conntrack. A connection made to the listener's
// port itself, which no rule redirects and conntrack may not know,
// dialed the listener's own port.
func originalPort(c *net.TCPConn, ipv6 bool) (uint16, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var port uint16
	var serr error
	err = raw.Control(func(fd uintptr) {
		if ipv6 {
			var sa unix.RawSockaddrInet6
			serr = getsockopt(fd, unix.SOL_IPV6, ip6tSoOriginalDst, unsafe.Pointer(&sa), unsafe.Sizeof(sa))
			if serr == nil && sa.Family != unix.AF_INET6 {
				serr = fmt.Errorf("address family %d", sa.Family)
			}
			port = binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
			return
		}
		var sa unix.RawSockaddrInet4
		serr = getsockopt(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), unsafe.Sizeof(sa))
		if serr == nil && sa.Family != unix.AF_INET {
			serr = fmt.Errorf("address family %d", sa.Family)
		}
		port = binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	})
	if err != nil {
		return 0, err
	}
	if errors.Is(serr, unix.ENOENT) {
		return uint16(c.LocalAddr().(*net.TCPAddr).Port), nil
	}
	if serr != nil {
		return 0, fmt.Errorf("original destination of %s: %w", c.RemoteAddr(), serr)
	}
	if port == 0 {
		return 0, fmt.Errorf("original destination of %s: port 0", c.RemoteAddr())
	}
	return port, nil
}

// getsockopt reads the option of fd at level into the size bytes at p.
func getsockopt(fd uintptr, level, opt int, p unsafe.Pointer, size uintptr) error {
	n := uint32(size)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}
