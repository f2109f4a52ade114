// Package idlespin keeps CPUs from sleeping for a short while after each
// message a relay passes on, as the kernel's halt polling does where the
// machine allows it.
//
// A relay adds a process to the path of every message, and each message
// then wakes one process more. Where an idle virtual CPU halts at once
// (the guest kernel's halt polling off, guest_halt_poll_ns = 0, as on the
// Firecracker machine this was measured on), waking a process on it
// costs tens of microseconds in the host, more than the relay's own work. A thread that spins at SCHED_IDLE keeps its CPU awake: the
// scheduler still counts that CPU as idle, places woken tasks on it and
// lets them preempt the spinner at once, so the spinner takes no CPU
// time another task of this kernel wants (a hyperthread sibling, or
// another guest of the host, it still competes with). It spins only for
// a fixed window after the last message, and not at all where the
// process's cgroup has a CPU quota, which its spinning would use up, or
// where that cannot be told.
//
// The spinning threads live in a helper process of their own (the same
// executable, started with HelperCommand): a thread of the relay's own
// Go runtime would hold one of its Ps while it spins, and a SCHED_IDLE
// thread preempted on a busy machine may not run again for long, which
// would hold up every garbage collection of the relay. The relay and the
// helper share one page: the relay bumps a counter in it for each
// message, which the helper's threads watch while they spin and wait on
// (a futex) while they do not.
package idlespin
