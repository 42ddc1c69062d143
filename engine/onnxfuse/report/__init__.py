"""The HTML report of a run (``optimize --html``, ``report REPORT.json --html``): both
graphs side by side, laid out by Graphviz's dot, what each rule fused, and why the rules
that never applied did not."""
