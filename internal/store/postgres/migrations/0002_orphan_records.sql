-- Records scoped to a sandbox (policy revisions, settings, draft policy
-- chunks) are deleted with it since this version; remove the ones earlier
-- versions left behind.
DELETE FROM objects
WHERE object_type IN ('sandbox_policy', 'sandbox_settings', 'draft_policy_chunk')
  AND scope NOT IN (SELECT id FROM objects WHERE object_type = 'sandbox');
