"""Model intake: a released config.json uploaded (or taken from the catalog of real release configs), analysed
offline on upload, and planned on the team's clusters or a what-if one."""
