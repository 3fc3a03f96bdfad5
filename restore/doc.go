// Package restore carries the five isolated-restore control methods from Cloudly to a node's
// Corestore (SPEC §9). The control body holds a bearer grant: it is forwarded untouched and never
// logged; the package adds nothing to it and checks only Corestore's answer.
package restore
