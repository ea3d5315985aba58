from harness.report.summary import main

main()
