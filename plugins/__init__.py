"""Your own judges, tasks and algorithms: a module here registers what it adds, and params.yaml's
`plugins` names it (`plugins: [plugins.my_judge]`). Every stage depends on this folder, so an edit to a
plugin reruns the loop. docs/extending.md works an example of each."""
