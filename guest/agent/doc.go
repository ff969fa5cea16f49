// Package agent is cocoon-agent's service: the ttrpc Agent API of
// guest/api, the processes it runs in the guest, and the yamux session that
// carries the control stream and every process's stdio streams over the
// agent channel (a vsock connection or a virtio-serial port).
//
// The host opens every stream of a session and starts it with an
// api.StreamHeader. Control streams go to a ttrpc server; stdio streams are
// paired with the StartProcess call that names them, whichever of the two
// arrives first. A process's exit status becomes visible to WaitProcess
// only after its stdout and stderr were drained and their streams closed,
// so a host that reads those streams to EOF before it reports the exit
// never loses trailing output.
//
// The agent runs as PID 1 in the guest; its processes are collected by the
// reaper package, which is also correct when the agent runs as an ordinary
// process (tests, debugging).
//
// Containers run with an OCI runtime's CLI (crun in the guest image; runc
// works too), every runtime process started through the reaper. A
// container's init and its execs are grandchildren of the agent (the
// runtime forks them and exits); they are reparented to the agent and
// adopted by the reaper from the runtime's pid file, and from then on they are
// processes like any other: their stdio goes through the same streams,
// and WaitProcess, SignalProcess, CloseStdin and ResizePty work on them.
// Each container's root filesystem is assembled from the disks the host
// hot-plugged (DiskRootfs): EROFS layers and an ext4 scratch disk joined
// by overlayfs under Config.ContainerDir/<id>. Statistics, pids and OOM
// kills are read from the container's cgroup v2 directory. A container's
// bind mounts of host directories come as bind mounts whose sources are
// under api.ShareRoot, where the agent mounts the host's virtio-fs share
// (tag api.ShareTag, nodev, nosuid) the first time one needs it.
package agent

// Version is cocoon-agent's version, set at build time with
// -ldflags "-X github.com/cocoonrt/cocoon/guest/agent.Version=...".
var Version = "dev"
