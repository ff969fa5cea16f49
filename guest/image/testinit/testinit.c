/*
 * testinit: a stand-in for cocoon-agent as PID 1, for boot-time measurement
 * and device checks of the guest image.
 *
 *  - mounts /proc (and, for the device check, /sys, /dev as devtmpfs,
 *    cgroup2 at /sys/fs/cgroup)
 *  - with "cocoon.testinit=hotplug", waits for /sys/class/block/sda (a
 *    scsi-hd hot-plugged onto the virtio-scsi-device) and prints its size
 *  - prints "COCOON-TESTINIT-READY uptime=<s> idle=<s>" on the console as
 *    soon as /proc is mounted: bench-boot.sh measures QEMU start -> this line
 *  - with "cocoon.testinit=devices" on the kernel command line, prints what
 *    the agent will rely on: virtio-serial port names, virtio devices, block
 *    devices, hw_random, filesystems, cgroup v2 controllers
 *  - reboots (QEMU runs with -no-reboot, so it exits)
 *
 * Build: gcc -static -Os -o testinit testinit.c
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char buf[65536];

static const char *slurp(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		return NULL;
	buf[n] = 0;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = 0;
	return buf;
}

static void list_dir(const char *label, const char *dir, const char *leaf)
{
	DIR *d = opendir(dir);
	if (!d) {
		printf("COCOON-TESTINIT %s: (no %s)\n", label, dir);
		return;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (leaf) {
			char p[512];
			snprintf(p, sizeof(p), "%s/%s/%s", dir, e->d_name, leaf);
			const char *v = slurp(p);
			printf("COCOON-TESTINIT %s: %s %s=%s\n", label, e->d_name, leaf,
			       v ? v : "?");
		} else {
			printf("COCOON-TESTINIT %s: %s\n", label, e->d_name);
		}
	}
	closedir(d);
}

static void devices(void)
{
	mkdir("/sys", 0555);
	mkdir("/dev", 0755);
	if (mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
		printf("COCOON-TESTINIT mount sysfs: %s\n", strerror(errno));
	if (mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755"))
		printf("COCOON-TESTINIT mount devtmpfs: %s\n", strerror(errno));
	if (mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
		printf("COCOON-TESTINIT mount cgroup2: %s\n", strerror(errno));

	const char *v;
	printf("COCOON-TESTINIT kernel: %s\n", (v = slurp("/proc/version")) ? v : "?");
	printf("COCOON-TESTINIT cmdline: %s\n", (v = slurp("/proc/cmdline")) ? v : "?");
	list_dir("virtio-port", "/sys/class/virtio-ports", "name");
	list_dir("virtio-dev", "/sys/bus/virtio/devices", "device");
	list_dir("virtio-driver", "/sys/bus/virtio/drivers", NULL);
	list_dir("block", "/sys/class/block", "size");
	list_dir("scsi-host", "/sys/class/scsi_host", "proc_name");
	list_dir("net", "/sys/class/net", "address");
	list_dir("dev", "/dev", NULL);
	printf("COCOON-TESTINIT hwrng: %s\n",
	       (v = slurp("/sys/class/misc/hw_random/rng_current")) ? v : "?");
	printf("COCOON-TESTINIT cgroup2-controllers: %s\n",
	       (v = slurp("/sys/fs/cgroup/cgroup.controllers")) ? v : "?");
	printf("COCOON-TESTINIT clocksource: %s\n",
	       (v = slurp("/sys/devices/system/clocksource/clocksource0/current_clocksource")) ? v : "?");
	printf("COCOON-TESTINIT cpus: %s\n",
	       (v = slurp("/sys/devices/system/cpu/online")) ? v : "?");
	if ((v = slurp("/proc/filesystems"))) {
		printf("COCOON-TESTINIT filesystems:");
		for (char *t = strtok((char *)v, " \t\n"); t; t = strtok(NULL, " \t\n"))
			if (strcmp(t, "nodev"))
				printf(" %s", t);
		printf("\n");
	}
	printf("COCOON-TESTINIT entropy: %s\n",
	       (v = slurp("/proc/sys/kernel/random/entropy_avail")) ? v : "?");
	if ((v = slurp("/proc/cpuinfo"))) {
		const char *f = strstr(v, "\nflags");
		if (f) {
			const char *e = strchr(f + 1, '\n');
			printf("COCOON-TESTINIT cpu%.*s\n", (int)(e ? e - f - 1 : 200), f + 1);
		}
	}
	/* Timer health: a 200 ms sleep must take 200 ms and timer interrupts must
	 * arrive (noapictimer under TCG leaves the tick to the PIT). */
	{
		struct timespec a, b;
		unsigned long long t0, t1;
		unsigned int lo, hi;
		clock_gettime(CLOCK_MONOTONIC, &a);
		__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
		t0 = ((unsigned long long)hi << 32) | lo;
		usleep(200000);
		clock_gettime(CLOCK_MONOTONIC, &b);
		__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
		t1 = ((unsigned long long)hi << 32) | lo;
		long ms = (b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000;
		printf("COCOON-TESTINIT timer: sleep200ms monotonic=%ldms tsc_cycles=%llu\n", ms, t1 - t0);
		if ((v = slurp("/proc/interrupts"))) {
			for (char *l = strtok((char *)v, "\n"); l; l = strtok(NULL, "\n"))
				if (strstr(l, " 0:") || strstr(l, "LOC:") || strstr(l, "timer"))
					printf("COCOON-TESTINIT irq:%s\n", l);
		}
	}
	if (access("/usr/bin/crun", X_OK) == 0) {
		printf("COCOON-TESTINIT crun: present\n");
		/* crun is dynamically linked: running it checks its libraries. */
		fflush(stdout);
		pid_t pid = fork();
		if (pid == 0) {
			char *argv[] = {"crun", "--version", NULL};
			char *envp[] = {"PATH=/usr/bin:/usr/sbin", NULL};
			execve("/usr/bin/crun", argv, envp);
			_exit(127);
		}
		int st = 0;
		if (pid > 0)
			waitpid(pid, &st, 0);
		printf("COCOON-TESTINIT crun-exit: %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	}
	printf("COCOON-TESTINIT meminfo: %s\n", (v = slurp("/proc/meminfo")) ? strtok((char *)v, "\n") : "?");
	if ((v = slurp("/proc/uptime")))
		printf("COCOON-TESTINIT-DONE uptime=%s\n", v);
}

/* Wait (up to 30 s) for a disk hot-plugged onto virtio-scsi to appear. */
static void hotplug(void)
{
	mkdir("/sys", 0555);
	mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
	printf("COCOON-TESTINIT hotplug: waiting for sda\n");
	for (int i = 0; i < 300; i++) {
		const char *v = slurp("/sys/class/block/sda/size");
		if (v) {
			printf("COCOON-TESTINIT hotplug: sda size=%s\n", v);
			v = slurp("/sys/class/block/sda/device/model");
			printf("COCOON-TESTINIT hotplug: sda model=%s\n", v ? v : "?");
			return;
		}
		usleep(100000);
	}
	printf("COCOON-TESTINIT hotplug: timeout\n");
}

int main(void)
{
	/* The kernel opens /dev/console as fds 0-2 when the initramfs has it. */
	if (fcntl(1, F_GETFD) < 0) {
		int fd = open("/dev/console", O_RDWR | O_NOCTTY);
		if (fd >= 0) {
			dup2(fd, 0), dup2(fd, 1), dup2(fd, 2);
			if (fd > 2)
				close(fd);
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	mkdir("/proc", 0555);
	mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
	const char *up = slurp("/proc/uptime");
	printf("COCOON-TESTINIT-READY uptime=%s\n", up ? up : "?");

	const char *cmd = slurp("/proc/cmdline");
	if (cmd && strstr(cmd, "cocoon.testinit=devices"))
		devices();
	else if (cmd && strstr(cmd, "cocoon.testinit=hotplug"))
		hotplug();
	else if (cmd && strstr(cmd, "cocoon.testinit=wait"))
		pause();

	fflush(stdout);
	sync();
	reboot(RB_AUTOBOOT);
	reboot(RB_POWER_OFF);
	for (;;)
		pause();
}
