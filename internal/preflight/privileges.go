package preflight

import "context"

// This file checks the role: its attributes, and its grants on the outbox
// table (read with the table, loadTable).

// readRole reads the role's attributes. A non-OK Finding means it could not.
func (s *session) readRole(ctx context.Context) (roleFacts, Finding) {
	var r roleFacts
	err := s.db.QueryRow(ctx, `
		SELECT rolsuper, rolreplication,
		       CASE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication')
		            THEN pg_has_role(current_user, 'rds_replication', 'MEMBER') ELSE false END
		FROM pg_roles WHERE rolname = current_user`).Scan(&r.super, &r.replication, &r.rdsReplication)
	if err != nil {
		return r, failed(checkPrivileges, "read the attributes of role "+s.t.role, err)
	}
	return r, Finding{}
}

func loadRole(ctx context.Context, s *session) { s.role, s.roleErr = s.readRole(ctx) }

// privilegesCheck judges the role's attributes and grants; unknown grants
// (the table could not be read) are tableCheck's to report.
func privilegesCheck(_ context.Context, s *session) []Finding {
	switch {
	case !s.roleErr.ok():
		return []Finding{s.roleErr}
	case s.tableErr.ok():
		return classifyPrivileges(s.t, s.role)
	}
	return nil
}
