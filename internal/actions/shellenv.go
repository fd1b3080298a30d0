package actions

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ErrEnvNotAllowed is wrapped when a task's env sets a variable it may not.
var ErrEnvNotAllowed = errors.New("env variable not allowed")

// allowed_commands limits only a program's name; these variables decide
// which code that program runs (the loader, the search path, shell start-up
// and imported functions), so no task may set them, whatever the config.
var (
	forbiddenEnv = map[string]string{
		"PATH":           "it would choose the programs the command runs",
		"IFS":            "it changes how shell scripts split words",
		"BASH_ENV":       "bash runs the file it names before any script",
		"SHELLOPTS":      "it switches on bash options such as xtrace",
		"BASHOPTS":       "it switches on bash options",
		"PS4":            "bash expands it, running command substitutions, under xtrace",
		"GCONV_PATH":     "glibc loads code from the directory it names",
		"GLIBC_TUNABLES": "it tunes the dynamic loader",
	}
	forbiddenEnvPrefixes = map[string]string{
		"LD_":        "it is read by the dynamic loader",
		"DYLD_":      "it is read by the dynamic loader",
		"BASH_FUNC_": "bash imports it as a shell function",
	}
)

// Variables through which common tools take options or code (make's
// MAKEFLAGS, git's GIT_CONFIG_*, interpreters' search paths), or find the
// configuration files they load it from (HOME and XDG_CONFIG_HOME: git's
// ~/.gitconfig can define an alias or core.fsmonitor that runs any
// command; ENV and ZDOTDIR: shell start-up files): refused unless
// shell.allowed_env lists them. The list cannot be complete, which is why
// allowed_env exists.
var (
	toolEnv = []string{
		"MAKEFLAGS", "MFLAGS", "GNUMAKEFLAGS", "MAKEFILES",
		"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
		"PERL5LIB", "PERLLIB", "PERL5OPT", "RUBYLIB", "RUBYOPT",
		"NODE_OPTIONS", "NODE_PATH",
		"JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS",
		"GOFLAGS", "GOENV", "GOTOOLCHAIN", "RUSTC_WRAPPER", "SSH_ASKPASS",
		"TAR_OPTIONS", "RSYNC_RSH", "RSYNC_CONNECT_PROG", "CC", "CXX", "GZIP",
		"HOME", "ENV", "ZDOTDIR", "CURL_HOME", "WGETRC",
	}
	toolEnvPrefixes = []string{"GIT_", "XDG_", "npm_config_", "NPM_CONFIG_"}
)

// checkEnv returns a permanent error naming the first variable, by name, that
// the task may not set: see envNameProblem.
func checkEnv(env map[string]string, allowed []string, pinned bool) error {
	for _, name := range slices.Sorted(maps.Keys(env)) {
		if problem := envNameProblem(name, allowed, pinned); problem != "" {
			return Permanentf("%w: field \"env\": %q %s", ErrEnvNotAllowed, name, problem)
		}
	}
	return nil
}

// envNameProblem says why a task may not set name, or "" when it may. With
// allowed set, only the names it lists are allowed; without, any name but the
// tool variables, unless the command's arguments are pinned (pinned: it has
// shell.allowed_args), which takes only the names allowed lists, none when
// it is empty: the pinning would be for nothing when a variable the tool
// reads its options from (TAR_OPTIONS) could add --checkpoint-action=exec,
// and the tool-variable list cannot name them all. A forbidden or
// malformed name is never allowed.
func envNameProblem(name string, allowed []string, pinned bool) string {
	if problem := neverAllowedEnv(name); problem != "" {
		return problem
	}
	switch {
	case len(allowed) > 0 && !slices.Contains(allowed, name):
		return fmt.Sprintf("is not in shell.allowed_env %q", allowed)
	case len(allowed) > 0:
		return ""
	case pinned:
		return "is not in shell.allowed_env, which lists none: the command's arguments are pinned (shell.allowed_args), so a task sets only the variables it lists"
	case isToolEnv(name):
		return "can change what the command runs; list it in shell.allowed_env to allow it"
	}
	return ""
}

// neverAllowedEnv says why no task may set name, even when allowed_env
// lists it, or "" when the config may allow it.
func neverAllowedEnv(name string) string {
	if why := forbiddenEnvReason(name); why != "" {
		return "may never be set by a task: " + why
	}
	if !validEnvName(name) {
		// "PATH=/x:" as a name would become PATH=/x:=... in the child.
		return "is not a valid variable name (letters, digits and '_', not starting with a digit)"
	}
	return ""
}

func forbiddenEnvReason(name string) string {
	if why, ok := forbiddenEnv[name]; ok {
		return why
	}
	for prefix, why := range forbiddenEnvPrefixes {
		if strings.HasPrefix(name, prefix) {
			return why
		}
	}
	return ""
}

func isToolEnv(name string) bool {
	if slices.Contains(toolEnv, name) {
		return true
	}
	return slices.ContainsFunc(toolEnvPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// validEnvName reports whether name is a portable variable name. Anything
// else ('%' of exported bash functions, '=', NUL) is refused rather than
// passed to a program that may read it differently.
func validEnvName(name string) bool {
	if name == "" || (name[0] >= '0' && name[0] <= '9') {
		return false
	}
	for _, c := range []byte(name) {
		if c != '_' && (c < '0' || c > '9') && (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return true
}
