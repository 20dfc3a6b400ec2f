from traceql.capture.cli import main

main()
