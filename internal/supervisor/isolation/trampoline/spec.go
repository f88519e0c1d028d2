package trampoline

// Arg0 is argv[0] of the supervisor binary re-executed as the agent
// trampoline.
const Arg0 = "openshell-sandbox-agent-exec"

// File descriptors of the trampoline: the spec to read, and the status
// pipe that carries an error, or closes empty on a successful execve.
const (
	SpecFD   = 3
	StatusFD = 4
)

// Spec is what the trampoline is told over fd 3.
type Spec struct {
	Argv     []string     `json:"argv"`
	Env      []string     `json:"env"`
	Dir      string       `json:"dir,omitempty"`
	UID      uint32       `json:"uid"`
	GID      uint32       `json:"gid"`
	Landlock LandlockSpec `json:"landlock"`
}

// LandlockSpec is the Landlock part of a Spec.
type LandlockSpec struct {
	// Inherited: the trampoline already runs in the agents' Landlock
	// domain (the supervisor forked it from a thread restricted with the
	// ruleset) and adds none of its own; the paths are then empty.
	Inherited bool `json:"inherited,omitempty"`

	ReadOnly  []Path `json:"read_only,omitempty"`
	ReadWrite []Path `json:"read_write,omitempty"`
	Hard      bool   `json:"hard,omitempty"`
}

// Path is one Landlock rule path.
type Path struct {
	Path string `json:"path"`
	// Optional paths (the supervisor's baseline and defaults) are skipped
	// when they cannot be opened, whatever the compatibility mode.
	Optional bool `json:"optional,omitempty"`
}
