"""Static memory planning: one arena for every intermediate tensor."""
