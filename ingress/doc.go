// Package ingress serves the cluster ingress through the relay (SPEC §8): ingress registration
// forwarding, isolation by authorization, the route table held in memory and served to the
// ingress, change hints, and traffic statistics fanned out to every ingress connection.
package ingress
