package pgerr

// The SQLSTATE codes the relay tells apart, named as in PostgreSQL's
// errcodes.txt (Appendix A of its documentation).
const (
	FeatureNotSupported      = "0A000" // cached plan must not change result type
	UniqueViolation          = "23505" // also: a catalog row created concurrently
	InvalidAuthorizationSpec = "28000"
	InvalidPassword          = "28P01"
	InvalidCatalogName       = "3D000" // database does not exist
	DatatypeMismatch         = "42804"
	InsufficientPrivilege    = "42501"
	UndefinedColumn          = "42703"
	UndefinedObject          = "42704"
	DuplicateObject          = "42710"
	UndefinedFunction        = "42883" // also: operator does not exist
	TooManyConnections       = "53300"
	ObjectInUse              = "55006" // a replication slot active for another process
	AdminShutdown            = "57P01"
	CrashShutdown            = "57P02"
	CannotConnectNow         = "57P03" // the database system is starting up or shutting down
)
