// Package mountinfo reads the mount tables of /proc/PID/mountinfo: where
// each filesystem is mounted, which part of it, and of what type, for
// sandboxd's checks of what a container would see and of the cgroups it
// runs in.
package mountinfo
