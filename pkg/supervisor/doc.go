// Package supervisor runs the recovery side of Warden. Any number of
// supervisors run; they elect one leader on the "supervisor" key of the
// warden_leases bucket (package lease) and only the leader acts, every
// write checked against its fencing epoch.
package supervisor
