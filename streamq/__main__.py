from streamq.cli import main

main()
