// Package limits parses human-written resource limits into one model built on
// runtime-spec's LinuxResources and maps it to the Docker Engine's resources.
package limits
