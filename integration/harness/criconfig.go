package harness

// The pod and container configurations crictl reads (runp, create) and
// the statuses it prints (inspectp, inspect -o json), as far as the tests
// use them. crictl decodes a configuration file into the CRI's Go types
// (k8s.io/cri-api) with their JSON names, snake_case, enums as numbers;
// it prints statuses as protobuf JSON, camelCase, enums as names.

// PodConfig is a PodSandboxConfig.
type PodConfig struct {
	Metadata     PodMetadata       `json:"metadata"`
	Hostname     string            `json:"hostname,omitempty"`
	LogDirectory string            `json:"log_directory,omitempty"`
	PortMappings []PortMapping     `json:"port_mappings,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	Linux        *PodLinux         `json:"linux,omitempty"`
}

// PodMetadata names a pod: Name and Namespace are the Kubernetes pod's,
// UID its uid (crictl makes one if empty).
type PodMetadata struct {
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
	Namespace string `json:"namespace"`
	Attempt   uint32 `json:"attempt,omitempty"`
}

// PortMapping publishes a pod's port on the host (CNI's portmap).
type PortMapping struct {
	// Protocol is 0 for TCP, 1 for UDP, 2 for SCTP.
	Protocol      int32  `json:"protocol,omitempty"`
	ContainerPort int32  `json:"container_port"`
	HostPort      int32  `json:"host_port,omitempty"`
	HostIP        string `json:"host_ip,omitempty"`
}

// PodLinux is a LinuxPodSandboxConfig.
type PodLinux struct {
	// CgroupParent is the pods' cgroup parent, a cgroupfs path.
	CgroupParent    string              `json:"cgroup_parent,omitempty"`
	SecurityContext *PodSecurityContext `json:"security_context,omitempty"`
	Sysctls         map[string]string   `json:"sysctls,omitempty"`
	// Resources are the pod's limits, the sums of its containers',
	// as kubelet gives them.
	Resources *Resources `json:"resources,omitempty"`
}

// PodSecurityContext is a LinuxSandboxSecurityContext.
type PodSecurityContext struct {
	NamespaceOptions *NamespaceOptions `json:"namespace_options,omitempty"`
	Privileged       bool              `json:"privileged,omitempty"`
}

// NamespaceOptions says which namespaces are the pod's, the container's
// own or the host's.
type NamespaceOptions struct {
	Network NamespaceMode `json:"network,omitempty"`
	Pid     NamespaceMode `json:"pid,omitempty"`
	Ipc     NamespaceMode `json:"ipc,omitempty"`
}

// NamespaceMode is the CRI's NamespaceMode.
type NamespaceMode int32

// The namespace modes: the pod's (the default), the container's own,
// the host's (NODE).
const (
	NamespacePod       NamespaceMode = 0
	NamespaceContainer NamespaceMode = 1
	NamespaceNode      NamespaceMode = 2
)

// ContainerConfig is a ContainerConfig.
type ContainerConfig struct {
	Metadata   ContainerMetadata `json:"metadata"`
	Image      ImageSpec         `json:"image"`
	Command    []string          `json:"command,omitempty"`
	Args       []string          `json:"args,omitempty"`
	WorkingDir string            `json:"working_dir,omitempty"`
	Envs       []KeyValue        `json:"envs,omitempty"`
	Mounts     []Mount           `json:"mounts,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	// Annotations reach the runtime when its handler allows them
	// (container_annotations: io.cocoon.* for Cocoon's).
	Annotations map[string]string `json:"annotations,omitempty"`
	// LogPath is the container's log, relative to its pod's
	// LogDirectory.
	LogPath string          `json:"log_path,omitempty"`
	Stdin   bool            `json:"stdin,omitempty"`
	Tty     bool            `json:"tty,omitempty"`
	Linux   *ContainerLinux `json:"linux,omitempty"`
}

// ContainerMetadata names a container in its pod.
type ContainerMetadata struct {
	Name    string `json:"name"`
	Attempt uint32 `json:"attempt,omitempty"`
}

// ImageSpec names an image.
type ImageSpec struct {
	Image string `json:"image"`
}

// KeyValue is an environment variable.
type KeyValue struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Mount is a bind mount from the host.
type Mount struct {
	ContainerPath string `json:"container_path"`
	HostPath      string `json:"host_path"`
	Readonly      bool   `json:"readonly,omitempty"`
}

// ContainerLinux is a LinuxContainerConfig.
type ContainerLinux struct {
	Resources       *Resources                `json:"resources,omitempty"`
	SecurityContext *ContainerSecurityContext `json:"security_context,omitempty"`
}

// Resources are a container's limits (LinuxContainerResources).
type Resources struct {
	CPUPeriod          int64 `json:"cpu_period,omitempty"`
	CPUQuota           int64 `json:"cpu_quota,omitempty"`
	CPUShares          int64 `json:"cpu_shares,omitempty"`
	MemoryLimitInBytes int64 `json:"memory_limit_in_bytes,omitempty"`
}

// ContainerSecurityContext is a LinuxContainerSecurityContext.
type ContainerSecurityContext struct {
	NamespaceOptions   *NamespaceOptions `json:"namespace_options,omitempty"`
	Privileged         bool              `json:"privileged,omitempty"`
	RunAsUser          *Int64Value       `json:"run_as_user,omitempty"`
	RunAsGroup         *Int64Value       `json:"run_as_group,omitempty"`
	SupplementalGroups []int64           `json:"supplemental_groups,omitempty"`
	ReadonlyRootfs     bool              `json:"readonly_rootfs,omitempty"`
	Capabilities       *Capabilities     `json:"capabilities,omitempty"`
	// Seccomp is the container's seccomp profile; an empty one is the
	// runtime's default (RuntimeDefault, profile type 0).
	Seccomp *SecurityProfile `json:"seccomp,omitempty"`
}

// Capabilities are the capabilities a container adds and drops.
type Capabilities struct {
	Add  []string `json:"add_capabilities,omitempty"`
	Drop []string `json:"drop_capabilities,omitempty"`
}

// SecurityProfile is a seccomp or AppArmor profile: ProfileType 0 is
// RuntimeDefault, 1 Unconfined, 2 Localhost.
type SecurityProfile struct {
	ProfileType int32 `json:"profile_type,omitempty"`
}

// Int64Value is an optional int64 of the CRI.
type Int64Value struct {
	Value int64 `json:"value"`
}

// PodInspect is what `crictl inspectp -o json` prints: the pod's status
// and the runtime's verbose information.
type PodInspect struct {
	Status PodStatus      `json:"status"`
	Info   map[string]any `json:"info"`
}

// PodStatus is a PodSandboxStatus.
type PodStatus struct {
	ID       string `json:"id"`
	Metadata struct {
		Name      string `json:"name"`
		UID       string `json:"uid"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	// State is SANDBOX_READY or SANDBOX_NOTREADY.
	State   string `json:"state"`
	Network struct {
		IP string `json:"ip"`
	} `json:"network"`
	RuntimeHandler string            `json:"runtimeHandler"`
	Annotations    map[string]string `json:"annotations"`
}

// ContainerInspect is what `crictl inspect -o json` prints.
type ContainerInspect struct {
	Status ContainerStatus `json:"status"`
	Info   map[string]any  `json:"info"`
}

// ContainerStatus is a ContainerStatus.
type ContainerStatus struct {
	ID       string `json:"id"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	// State is CONTAINER_CREATED, CONTAINER_RUNNING, CONTAINER_EXITED or
	// CONTAINER_UNKNOWN.
	State    string `json:"state"`
	ExitCode int32  `json:"exitCode"`
	Reason   string `json:"reason"`
	Message  string `json:"message"`
	// LogPath is the container's log on the host.
	LogPath     string            `json:"logPath"`
	Annotations map[string]string `json:"annotations"`
}
