package contracts

// Method names the relay routes by. Seed-defined unless marked project-defined.

// Node runtime session methods the relay itself reads.
const (
	MethodRegisterPalletRuntimeSession       = "registerPalletRuntimeSession"       // node → relay → Cloudly
	MethodApplyRuntimeNetworkDnsLeaseRenewal = "applyRuntimeNetworkDnsLeaseRenewal" // Cloudly or escrow → node
)

// Methods Cloudly calls on the relay itself (docs/protocol.md#node-runtime-sessions): the relay serves them, never forwards them.
const (
	MethodPushClusterVpnMembership           = "pushClusterVpnMembership" // project-defined
	MethodHoldRuntimeNetworkDnsLeaseRenewals = "holdRuntimeNetworkDnsLeaseRenewals"
	MethodPushClusterRouteTable              = "pushClusterRouteTable"
	MethodGetClusterTrafficStatistics        = "getClusterTrafficStatistics"
	MethodPrepareIsolatedRestoreOnNode       = "prepareIsolatedRestoreOnNode"
	MethodStageIsolatedRestoreArchive        = "stageIsolatedRestoreArchive"
	MethodGetIsolatedRestoreProgressOnNode   = "getIsolatedRestoreProgressOnNode"
	MethodExecuteIsolatedRestoreOnNode       = "executeIsolatedRestoreOnNode"
	MethodCleanupIsolatedRestoreOnNode       = "cleanupIsolatedRestoreOnNode"
)

// Cluster ingress methods (docs/protocol.md#cluster-ingress).
const (
	MethodGetClusterRouteTable                = "getClusterRouteTable" // relay → Cloudly
	MethodRegisterClusterIngress              = "registerClusterIngress"
	MethodGetClusterIngressRouteTable         = "getClusterIngressRouteTable"
	MethodPushClusterIngressRouteTableChanged = "pushClusterIngressRouteTableChanged"
)

// The seed's relay → Cloudly rows (platform desired state, database closures, secret recipient
// enrollment): calls the relay makes for itself, never accepted from a node or the ingress.
const (
	MethodGetClusterPlatformDesiredState    = "getClusterPlatformDesiredState"
	MethodBackupServiceDatabaseClosure      = "backupServiceDatabaseClosure"
	MethodRestoreServiceDatabaseClosure     = "restoreServiceDatabaseClosure"
	MethodBeginSecretRecipientEnrollment    = "beginSecretRecipientEnrollment"
	MethodCompleteSecretRecipientEnrollment = "completeSecretRecipientEnrollment"
)

var isolatedRestoreMethods = [...]string{
	MethodPrepareIsolatedRestoreOnNode, MethodStageIsolatedRestoreArchive, MethodGetIsolatedRestoreProgressOnNode,
	MethodExecuteIsolatedRestoreOnNode, MethodCleanupIsolatedRestoreOnNode,
}

// IsolatedRestoreMethods are the five node-control methods, in the order a restore runs them
// (progress may be read at any time).
func IsolatedRestoreMethods() [5]string { return isolatedRestoreMethods }

// IsIsolatedRestoreMethod reports whether m is one of the five.
func IsIsolatedRestoreMethod(m string) bool {
	for _, r := range isolatedRestoreMethods {
		if r == m {
			return true
		}
	}
	return false
}

// IsServedToCloudly reports whether m is a Cloudly → relay method the relay serves itself.
func IsServedToCloudly(m string) bool {
	switch m {
	case MethodPushClusterRelayConfig, MethodPushClusterVpnMembership, MethodHoldRuntimeNetworkDnsLeaseRenewals,
		MethodPushClusterRouteTable, MethodGetClusterTrafficStatistics, MethodPushCorestoreCredential:
		return true
	}
	return IsIsolatedRestoreMethod(m)
}

// IsRelayCallToCloudly reports whether m is one of the methods the relay calls on Cloudly for
// itself (docs/protocol.md#node-runtime-sessions: registerCloudlyClientSession, registerClusterRelay, getClusterRouteTable and the
// seed's five relay → Cloudly rows; and the project-defined registerClusterVpnHub, docs/protocol.md#upstream-session). Cloudly answers them on the relay's socket as the relay's
// own, so they are never forwarded for a downstream peer: a node could otherwise read the route
// table with its keys, re-register the relay or its hub, or act for the cluster.
func IsRelayCallToCloudly(m string) bool {
	switch m {
	case MethodRegisterCloudlyClientSession, MethodRegisterClusterRelay, MethodRegisterClusterVpnHub, MethodGetClusterRouteTable,
		MethodGetClusterPlatformDesiredState, MethodBackupServiceDatabaseClosure, MethodRestoreServiceDatabaseClosure,
		MethodBeginSecretRecipientEnrollment, MethodCompleteSecretRecipientEnrollment:
		return true
	}
	return false
}

// IsLocalOnlyMethod reports whether m belongs to a controller on the node's own host and never
// crosses the relay (seed: exec and volume archives are Onebox-only; the local controller binds
// itself with bindPalletLocalRuntimeController). Refused with relay-method-local-only.
func IsLocalOnlyMethod(m string) bool {
	switch m {
	case "openRuntimeAssignmentExec", "resizeRuntimeAssignmentExec", "closeRuntimeAssignmentExec",
		"readRuntimeLocalVolumeArchive", "writeRuntimeLocalVolumeArchive", "bindPalletLocalRuntimeController":
		return true
	}
	return false
}

// Node → Cloudly methods whose request must carry the node's session (seed-defined).
const (
	MethodReportRuntimeAssignmentLogs    = "reportRuntimeAssignmentLogs"
	MethodReadRuntimeAssignmentStats     = "readRuntimeAssignmentStats"
	MethodGetRuntimeManagedVpnCredential = "getRuntimeManagedVpnCredential"
)

// RequiresSession reports whether a node's request of method m must carry its session: the
// requests of the interfaces readme's "Runtime Workload Logs, Stats, Exec And Volume Archives"
// ("Every request carries `session`"; exec and archives never cross the relay, IsLocalOnlyMethod)
// and getRuntimeManagedVpnCredential ("Its request carries the exact current session"). Every
// other node request is authenticated by the connection it came on ("uses the current
// authenticated physical peer", "Current-peer") and may carry none; one that does carry a session
// must name the connection's own node all the same.
func RequiresSession(m string) bool {
	switch m {
	case MethodReportRuntimeAssignmentLogs, MethodReadRuntimeAssignmentStats, MethodGetRuntimeManagedVpnCredential:
		return true
	}
	return IsLocalOnlyMethod(m) && m != "bindPalletLocalRuntimeController"
}
