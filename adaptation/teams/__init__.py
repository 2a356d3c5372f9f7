"""Teams: who may see and change what (every row belongs to a team), the team-choice rule of the forms, and a
user's API token."""
